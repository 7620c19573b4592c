"""A worker's allocations, kept by the supervisor so that they outlive the worker.

A worker journals every TURN-UDP allocation over its socket channel (`Channel`: the worker's
`stunnerd.workers.sockets.FdChannel`) whenever the allocation changes (`JournalWriter`, which
`records.RecordJournal` makes the `stunnerd.net.ports.AllocationJournal` of a worker): an entry
(`contracts.worker_messages.JournalEntry`; `JournalDelete` when it is gone) is the allocation's
handoff record (`state.AllocationRecord`) with the monotonic time it was taken at, and for a new
allocation the duplicates of its relay sockets (SCM_RIGHTS).
The supervisor reads them as they come (`Journal.read`) and holds the sockets until the entry is
deleted. When the worker dies, its replacement is given the live entries as a handoff document,
their lifetimes counted down by the time that passed, and the sockets beside it (`handover`):
the new worker adopts them before it reads its listener socket, so the clients carry on. In a
handoff between two multi-process stunnerds, the old supervisor offers what its workers'
journals hold (`stunnerd.handoff.pool`).

The cost, per allocation: one message of a few hundred bytes per change (`python -m bench
restart` measures it) and, in the supervisor, one dict and one fd.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from stunner_common.contracts.worker_messages import (
    MAX_CHANNEL_MESSAGE_BYTES,
    ChannelMessage,
    JournalDelete,
    JournalEntry,
    decode_channel,
)
from stunnerd.handoff.transport.state import (
    FORMAT,
    VERSION,
    Address,
    AllocationRecord,
    HandoffFormatError,
    allocation_doc,
    read_allocation,
)

log = logging.getLogger(__name__)

MAX_FDS = 2
"""A dual allocation's two relay sockets."""


class Channel(Protocol):
    """The Unix socket between a worker and its supervisor (SOCK_SEQPACKET, the contract's
    channel messages, some carrying fds): `stunnerd.workers.sockets.FdChannel`."""

    @property
    def sock(self) -> socket.socket: ...

    def send_many(self, message: ChannelMessage, fds: Sequence[int]) -> int:
        """One message with its fds (duplicated into the peer); the bytes it took."""
        ...


class JournalWriter:
    """The worker's side: each change of an allocation, sent to the supervisor at once."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.sent = 0  # messages
        self.sent_bytes = 0

    def changed(self, listener: str, record: AllocationRecord, fds: Sequence[int]) -> None:
        message = JournalEntry(listener, time.monotonic(), allocation_doc(record))
        self.sent_bytes += self.channel.send_many(message, fds)
        self.sent += 1

    def deleted(self, listener: str, client: Address) -> None:
        message = JournalDelete(listener, client)
        self.sent_bytes += self.channel.send_many(message, ())
        self.sent += 1


@dataclass(slots=True)
class Entry:
    """One allocation as last journaled, and the supervisor's copies of its relay sockets."""

    record: dict[str, Any]
    at: float
    sockets: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


class Journal:
    """The supervisor's side: one worker's live allocations, by listener and client."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, Address], Entry] = {}
        self.received = 0  # messages
        self.received_bytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def read(self, channel: Channel) -> None:
        """Take every message the worker has queued (call when the channel is readable)."""
        channel.sock.settimeout(0.0)
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(
                    channel.sock, MAX_CHANNEL_MESSAGE_BYTES, MAX_FDS
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("journal: channel closed: %s", exc)
                return
            if not data:
                for fd in fds:
                    os.close(fd)
                return
            self.received += 1
            self.received_bytes += len(data)
            try:
                self.take(decode_channel(data), fds)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                # e.g. a record over MAX_CHANNEL_MESSAGE_BYTES (thousands of permissions), cut
                # short: that allocation is not kept across a crash; the others are.
                log.warning("journal: unreadable message from the worker left out: %r", exc)
                for fd in fds:
                    os.close(fd)

    def take(self, message: ChannelMessage, fds: Sequence[int]) -> None:
        if isinstance(message, JournalEntry):
            record = dict(message.record)
            key = (message.listener, message.client)
            entry = self.entries.get(key)
            if entry is None or fds:
                if entry is not None:
                    entry.close()  # the client allocated anew on the same 5-tuple
                entry = self.entries[key] = Entry(record, message.at)
                entry.sockets = [socket.socket(fileno=fd) for fd in fds]
            else:
                entry.record, entry.at = record, message.at
        elif isinstance(message, JournalDelete):
            gone = self.entries.pop((message.listener, message.client), None)
            if gone is not None:
                gone.close()
        else:
            for fd in fds:
                os.close(fd)

    def live(
        self, listeners: Iterable[str], worker: int = 0, now: float | None = None
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """The live entries of `listeners` as the handoff document's listener objects, and
        their relay sockets' fds in the order they name them; entries that expired or lost
        their listener are dropped (and their sockets closed)."""
        now = time.monotonic() if now is None else now
        keep = set(listeners)
        by_listener: dict[str, list[dict[str, Any]]] = {}
        fds: list[int] = []
        for key, entry in list(self.entries.items()):
            doc = _aged(entry, now - entry.at)
            if key[0] not in keep or doc is None or not _readable(doc, key):
                self.entries.pop(key).close()
                continue
            by_listener.setdefault(key[0], []).append(doc)
            fds.extend(sock.fileno() for sock in entry.sockets)
        docs = [{"name": n, "worker": worker, "allocations": a} for n, a in by_listener.items()]
        return docs, fds

    def handover(
        self, listeners: Iterable[str], nonce_key: bytes, now: float | None = None
    ) -> tuple[str, list[int]]:
        """The live entries of `listeners` as a handoff document for a replacement worker, and
        the fds of their relay sockets in the order it names them."""
        docs, fds = self.live(listeners, now=now)
        document = {
            "format": FORMAT,
            "version": VERSION,
            "nonce_key": nonce_key.hex(),
            "listeners": docs,
        }
        return json.dumps(document, separators=(",", ":")), fds

    def close(self) -> None:
        for entry in self.entries.values():
            entry.close()
        self.entries.clear()


def _readable(doc: dict[str, Any], key: tuple[str, Address]) -> bool:
    """Whether the replacement can read the record: one it cannot is left out, not the lot."""
    try:
        read_allocation(doc, f"{key[0]} {key[1]}")
    except HandoffFormatError as exc:
        log.warning("journal: allocation left out: %s", exc)
        return False
    return True


def _aged(entry: Entry, elapsed: float) -> dict[str, Any] | None:
    """The record `elapsed` seconds later; None when it expired or lacks its relay sockets."""
    record = entry.record
    left = float(record["expires_in_s"]) - elapsed
    wanted = 2 if record.get("additional") else 1
    if left <= 0 or len(entry.sockets) != wanted:
        return None
    permissions = {
        ip: float(t) - elapsed for ip, t in record["permissions"].items() if float(t) - elapsed > 0
    }
    channels = [
        {**ch, "expires_in_s": float(ch["expires_in_s"]) - elapsed}
        for ch in record["channels"]
        if float(ch["expires_in_s"]) - elapsed > 0
    ]
    return {**record, "expires_in_s": left, "permissions": permissions, "channels": channels}
