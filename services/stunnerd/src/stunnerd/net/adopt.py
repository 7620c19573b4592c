"""Allocations that outlive the process serving them: journaled as they change, adopted elsewhere.

A worker process journals each TURN-UDP allocation of its listeners to the supervisor whenever it
changes (`stunnerd.net.ports.AllocationJournal`): when it is created (with duplicates of its relay
sockets, by SCM_RIGHTS), after every request its client makes (Refresh, CreatePermission,
ChannelBind and their refreshes), and when it is deleted. The journal writes the allocation as
the handoff document's record (`stunnerd.handoff.transport.records.record_of`: 5-tuple,
credentials' key, relay addresses, lifetime, permissions, channels), so the supervisor can give a
replacement worker everything it needs, and a stunnerd handing off can give its successor the
same. This module is the edge's part of the handoff (`stunnerd.handoff`), which the edge reaches
only through the interfaces of `stunnerd.net.ports`.

Handed-over allocations arrive as `stunnerd.net.ports.HandedAllocation`s (the document's
records). Adoption runs in two steps, so a client never meets a listener that does not know it:
`take_over` puts the allocations into the engine before the listener reads a datagram (a Refresh
is answered, ChannelData waits for its route); `open_adopted` then wraps each relay socket in the
listener's relay protocol and announces the routes, which reach every route table (the Python
dicts, the C relay, the kernel's maps). Expiries travel as seconds left and are read against
this process's clock. Stream and DTLS clients are not journaled: their connection or session dies
with the process, and their allocation with it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from typing import Protocol

from stunnerd.net.allocate import RelayHost
from stunnerd.net.ports import AllocationJournal, HandedAllocation
from stunnerd.net.relay import Address
from stunnerd.turn.allocation import Allocation, Channel

log = logging.getLogger(__name__)


class Listener(RelayHost, Protocol):
    """What journaling and adopting need of a listener (`stunnerd.net.listener.Listener`)."""

    journal: AllocationJournal | None
    adopted: dict[Address, tuple[socket.socket, socket.socket | None]]
    allocations_are_connections: bool
    connections: int

    def client_closed(self, client: Address) -> None:
        """The client is gone (its allocation ends)."""


def allocation_of(record: HandedAllocation, now: float) -> Allocation:
    """The allocation a record describes, its lifetimes counted from `now`."""
    alloc = Allocation(
        record.client,
        record.user_id,
        record.key,
        record.relay,
        record.family,
        now + record.expires_in_s,
        record.username,
        record.tcp,
        record.additional,
    )
    alloc.permissions = {ip: now + left for ip, left in record.permissions.items() if left > 0}
    for ch in record.channels:
        if ch.expires_in_s > 0:
            alloc.channels[ch.number] = Channel(ch.number, ch.peer, now + ch.expires_in_s)
    return alloc


def relay_sockets(alloc: Allocation, listener: Listener) -> list[int]:
    """The fds of an allocation's relay sockets (its own, then a dual allocation's IPv6 one)."""
    return [
        relay.sock.fileno()
        for relay in (listener.relays.get(alloc.client), listener.dual_relays.get(alloc.client))
        if relay is not None
    ]


def is_request(data: bytes) -> bool:
    """A STUN request (not ChannelData, an indication or an answer): it may change state."""
    return len(data) > 1 and not data[0] & 0xC1 and not data[1] & 0x10


def journal(listener: Listener, client: Address, *, created: bool = False) -> None:
    """Journal `client`'s allocation as it now stands (with its relay sockets when `created`)."""
    target = listener.journal
    alloc = listener.engine.allocations.get(client)
    if target is None or alloc is None:
        return
    fds = relay_sockets(alloc, listener) if created else ()
    try:
        target.changed(listener.name, alloc, listener.loop.time(), fds)
    except OSError as exc:
        log.warning("listener %s: allocation of %s not journaled: %s", listener.name, client, exc)


def forget(listener: Listener, client: Address) -> None:
    """Journal that `client`'s allocation is gone."""
    if listener.journal is not None:
        try:
            listener.journal.deleted(listener.name, client)
        except OSError as exc:
            log.warning("listener %s: end of %s not journaled: %s", listener.name, client, exc)


def take_over(
    listener: Listener, records: Sequence[HandedAllocation], sockets: dict[Address, socket.socket]
) -> int:
    """Step one, before the listener reads: the engine carries the allocations on.

    `sockets` holds the relay sockets by the relay address a record names; a record without
    its socket, or whose client already has an allocation here, is left out (its socket closed).
    """
    now = listener.loop.time()
    taken = 0
    for record in records:
        own = sockets.pop(record.relay, None)
        dual = sockets.pop(record.additional, None) if record.additional is not None else None
        complete = record.additional is None or dual is not None
        if (
            own is not None
            and complete
            and not record.tcp
            and listener.engine.adopt(allocation_of(record, now))
        ):
            listener.adopted[record.client] = (own, dual)
            taken += 1
            continue
        for sock in (own, dual):
            if sock is not None:
                sock.close()
        forget(listener, record.client)  # the supervisor closes its copies too
    for sock in sockets.values():
        sock.close()
    return taken


async def open_adopted(listener: Listener) -> None:
    """Step two, once the listener serves: the relays read again and the routes are announced."""
    adopted, listener.adopted = listener.adopted, {}
    for client, (own, dual) in adopted.items():
        try:
            relay = await listener.open_relay_endpoint(client, own)
            listener.relays[client] = relay
            if dual is not None:
                listener.dual_relays[client] = await listener.open_relay_endpoint(client, dual)
        except OSError as exc:
            log.warning("listener %s: adopted relay of %s failed: %s", listener.name, client, exc)
            listener.client_closed(client)
            continue
        if listener.allocations_are_connections:
            listener.connections += 1
        listener.apply(listener.engine.announce(client, listener.loop.time()))
    if adopted:
        log.info("listener %s: carried on %d allocation(s)", listener.name, len(adopted))
