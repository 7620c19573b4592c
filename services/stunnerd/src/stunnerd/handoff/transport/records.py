"""A live allocation as the handoff document's record, and the journal that writes such records.

The edge hands its allocations to `stunnerd.net.ports.AllocationJournal` as the engine holds
them (`stunnerd.turn.allocation.Allocation`, its expiries read on the loop's clock); what is
journaled and handed over is the document's `AllocationRecord`, its lifetimes as seconds left.
`record_of` makes one from the other (`record_json` its document's JSON directly, as the journal
carries it); `RecordJournal` is the `AllocationJournal` that
journals such records (`journal.JournalWriter`). The way back, record to allocation, is the
edge's (`stunnerd.net.adopt.allocation_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii as _string
from typing import Any, Protocol

from stunnerd.handoff.transport.state import Address, AllocationRecord, ChannelRecord


class LiveChannel(Protocol):
    """A bound channel as the engine holds it (`stunnerd.turn.allocation.Channel`)."""

    @property
    def number(self) -> int: ...

    @property
    def peer(self) -> Address: ...

    @property
    def expires(self) -> float: ...


class LiveAllocation(Protocol):
    """An allocation as the engine holds it (`stunnerd.turn.allocation.Allocation`)."""

    @property
    def client(self) -> Address: ...

    @property
    def user_id(self) -> str: ...

    @property
    def key(self) -> bytes: ...

    @property
    def username(self) -> str: ...

    @property
    def relay(self) -> Address: ...

    @property
    def family(self) -> int: ...

    @property
    def expires(self) -> float: ...

    @property
    def additional(self) -> Address | None: ...

    @property
    def tcp(self) -> bool: ...

    @property
    def permissions(self) -> Mapping[str, float]: ...

    @property
    def channels(self) -> Mapping[int, LiveChannel]: ...


def record_of(alloc: LiveAllocation, now: float) -> AllocationRecord:
    """The allocation as a handoff record, its lifetimes as seconds left after `now`."""
    return AllocationRecord(
        client=alloc.client,
        user_id=alloc.user_id,
        key=alloc.key,
        username=alloc.username,
        relay=alloc.relay,
        family=alloc.family,
        expires_in_s=max(0.0, alloc.expires - now),
        additional=alloc.additional,
        tcp=alloc.tcp,
        permissions={
            ip: expires - now for ip, expires in alloc.permissions.items() if expires > now
        },
        channels=tuple(
            ChannelRecord(ch.number, ch.peer, ch.expires - now)
            for ch in alloc.channels.values()
            if ch.expires > now
        ),
    )


_RECORD = json.JSONEncoder(separators=(",", ":"))
_INFINITY = float("inf")


def record_bytes(doc: Mapping[str, Any]) -> bytes:
    """A record's document (`state.allocation_doc`) as the journal carries and keeps it: compact
    ASCII JSON."""
    return _RECORD.encode(doc).encode()


def _number(value: float) -> str:
    """A lifetime left, as `json` writes it (`repr`, but `Infinity` for an endless one)."""
    return repr(value) if value < _INFINITY else "Infinity"


_NONE_BOUND = '"permissions":{},"channels":[]}'
"""The end of the record of an allocation with no permission or channel: a new one."""


def _bound(alloc: LiveAllocation, now: float) -> str:
    """The end of the record: its permissions and channels with the seconds they have left."""
    permissions = ",".join(
        f"{_string(ip)}:{_number(at - now)}" for ip, at in alloc.permissions.items() if at > now
    )
    channels = ",".join(
        f'{{"number":{ch.number},"peer":[{_string(ch.peer[0])},{ch.peer[1]}],'
        f'"expires_in_s":{_number(ch.expires - now)}}}'
        for ch in alloc.channels.values()
        if ch.expires > now
    )
    return f'"permissions":{{{permissions}}},"channels":[{channels}]}}'


def record_json(alloc: LiveAllocation, now: float) -> bytes:
    """`record_bytes(allocation_doc(record_of(alloc, now)))`, byte for byte, written straight
    from the live allocation: the journal writes one for each change of each allocation, and
    this costs a fifth of building the record and its document and encoding it. The strings are
    escaped as `json` does (its own C escaper), the numbers written as it writes them."""
    client, relay, additional = alloc.client, alloc.relay, alloc.additional
    left = alloc.expires - now  # max(0.0, left) as json writes it, in line: a call costs here
    return (
        f'{{"client":[{_string(client[0])},{client[1]}],"user_id":{_string(alloc.user_id)},'
        f'"key":"{alloc.key.hex()}","username":{_string(alloc.username)},'
        f'"relay":[{_string(relay[0])},{relay[1]}],"family":{alloc.family},"expires_in_s":'
        f"{repr(left) if 0.0 < left < _INFINITY else 'Infinity' if left == _INFINITY else '0.0'},"
        f'"additional":'
        f"{'null' if additional is None else f'[{_string(additional[0])},{additional[1]}]'},"
        f'"tcp":{"true" if alloc.tcp else "false"},'
        f"{_bound(alloc, now) if alloc.permissions or alloc.channels else _NONE_BOUND}"
    ).encode()


class RecordSink(Protocol):
    """A journal of handoff records (`journal.JournalWriter`)."""

    def changed(self, listener: str, client: Address, record: bytes, fds: Sequence[int]) -> None:
        """`client`'s allocation as it stands, as its record's JSON (`record_json`); `fds` its
        relay sockets when it is new."""

    def deleted(self, listener: str, client: Address) -> None:
        """The allocation is gone."""


class RecordJournal:
    """An `AllocationJournal` (`stunnerd.net.ports`) that journals each allocation as its
    handoff record into `sink`."""

    __slots__ = ("sink",)

    def __init__(self, sink: RecordSink) -> None:
        self.sink = sink

    def changed(
        self, listener: str, allocation: LiveAllocation, now: float, fds: Sequence[int]
    ) -> None:
        self.sink.changed(listener, allocation.client, record_json(allocation, now), fds)

    def deleted(self, listener: str, client: Address) -> None:
        self.sink.deleted(listener, client)
