"""Hot handoff of a single-process stunnerd: its TURN-UDP sockets and allocations to a new one.

The running process serves a `HandoffServer` (`transport.channel`) at `STUNNERD_HANDOFF_SOCKET`
(`listen`) with a `LocalHandoffSource` (with worker processes: `pool.PoolHandoffSource`): asked
for an offer, it refuses a process that cannot read its state version, else it freezes every
listener (requests are dropped, so the clients retransmit them to the new process; ChannelData
and peer data keep flowing) and offers the state document (`transport.state`: the nonce key,
the TURN-UDP listener sockets, each allocation with its relay sockets). If the new process gives
up, the listeners thaw and nothing changed; once it serves, this one exits.

The new process (`successor_at`, either kind) asks before it binds anything, builds its
`TurnServer` on the nonce key and a socket source of the handed listener sockets, gives it the
allocations to adopt (`net.adopt`) and applies its config; `confirm` or `refuse` answers the old
one. TCP, TLS and DTLS listeners are not handed over: the new process binds them once the old
one has let go (they are retried like any busy port), and their clients reconnect. The health
and metrics servers' listening sockets travel beside the state (`NamedSocket`): the new process
serves on them, so the ports stay answered throughout.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from stunner_common.contracts.socket_key import SocketKey
from stunnerd.handoff.pool import PoolHandoffSource
from stunnerd.handoff.transport.channel import (
    HandoffError,
    HandoffRefusedError,
    HandoffServer,
    HandoffSource,
    Offer,
    Received,
    take_over,
)
from stunnerd.handoff.transport.named import NamedSocket
from stunnerd.handoff.transport.records import record_of
from stunnerd.handoff.transport.state import (
    READABLE_VERSIONS,
    VERSION,
    HandoffState,
    ListenerRecord,
    SocketRecord,
    decode_state,
    encode_state,
)
from stunnerd.net.server import TurnServer
from stunnerd.net.udp import UdpListener
from stunnerd.workers.local import LocalDataplane
from stunnerd.workers.pool import WorkerPool

log = logging.getLogger(__name__)


class LocalHandoffSource:
    """The old side: the state and sockets of this process's TURN-UDP listeners."""

    def __init__(self, server: TurnServer) -> None:
        self.server = server
        self.released = False

    def _udp_listeners(self) -> list[UdpListener]:
        return [
            lst
            for lst in self.server.listeners.values()
            if isinstance(lst, UdpListener) and lst.sock is not None
        ]

    async def prepare(self, readable: Sequence[int]) -> Offer:
        if VERSION not in readable:
            raise HandoffRefusedError(
                f"this stunnerd writes state version {VERSION}; the new one reads "
                f"{', '.join(map(str, sorted(readable))) or 'none'}: keeping on serving"
            )
        listeners = self._udp_listeners()
        for lst in self.server.listeners.values():
            lst.frozen = True
        sockets: list[SocketRecord] = []
        records: list[ListenerRecord] = []
        fds: list[int] = []
        relay_fds: list[int] = []
        for lst in listeners:
            assert lst.sock is not None
            sockets.append(SocketRecord("udp", lst.spec.bind_host, lst.spec.port))
            fds.append(lst.sock.fileno())
            now = lst.loop.time()
            allocations = []
            for alloc in lst.engine.allocations.values():
                own, dual = lst.relays.get(alloc.client), lst.dual_relays.get(alloc.client)
                if own is None or (alloc.additional is not None and dual is None):
                    continue
                allocations.append(record_of(alloc, now))
                relay_fds.extend(r.sock.fileno() for r in (own, dual) if r is not None)
            records.append(ListenerRecord(lst.name, tuple(allocations)))
        state = HandoffState(tuple(records), self.server.nonce_key, tuple(sockets))
        log.info(
            "handoff: offering %d listener socket(s) and %d allocation(s)",
            len(sockets),
            state.allocation_count(),
        )
        return Offer(encode_state(state), VERSION, fds + relay_fds, self._resume, self._release)

    async def _resume(self) -> None:
        for lst in self.server.listeners.values():
            lst.frozen = False

    async def _release(self) -> None:
        self.released = True
        if self.server.offload is not None:
            self.server.offload.let_go()


class HandedSockets:
    """The new side's listener sockets from the old process, by key (a `SocketSource`)."""

    def __init__(self, records: Sequence[SocketRecord], socks: Sequence[socket.socket]) -> None:
        self.sockets = {
            SocketKey(r.kind, r.host, r.port): s for r, s in zip(records, socks, strict=True)
        }
        self.taken: set[SocketKey] = set()

    def take(self, key: SocketKey) -> socket.socket | None:
        sock = self.sockets.get(key)
        if sock is None:
            return None
        self.taken.add(key)
        dup = sock.dup()
        dup.setblocking(False)
        return dup

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()


async def listen(
    path: Path, dataplane: object, named: Callable[[], Sequence[NamedSocket]] | None = None
) -> HandoffServer | None:
    """Listen for a successor at `path`, handing it `named` (the admin servers' listening
    sockets) beside the state; None (logged) when it cannot."""
    source: HandoffSource
    if isinstance(dataplane, LocalDataplane):
        source = LocalHandoffSource(dataplane.server)
    elif isinstance(dataplane, WorkerPool):
        source = PoolHandoffSource(dataplane)
    else:
        return None
    server = HandoffServer(path, source, named=named)
    try:
        await server.start()
    except (OSError, HandoffError) as exc:
        log.error("handoff: cannot listen at %s: %s", path, exc)
        return None
    return server


def take(path: Path) -> tuple[Received, HandoffState] | None:
    """Ask a running stunnerd at `path` for its state (blocking); None when none runs there.

    Raises HandoffRefusedError when it refuses, HandoffError when the handoff fails.
    """
    received = take_over(path, tuple(READABLE_VERSIONS))
    if received is None:
        return None
    try:
        state = decode_state(received.document)
        if len(received.fds) != state.fd_count():
            raise HandoffRefusedError(f"{len(received.fds)} fds for {state.fd_count()} sockets")
    except ValueError as exc:  # HandoffFormatError too
        received.refuse(str(exc))
        raise HandoffRefusedError(str(exc)) from exc
    return received, state


class Successor:
    """The new side while it starts: what it took, until it tells the old process how it went."""

    def __init__(self, received: Received, state: HandoffState) -> None:
        self.received = received
        self.state = state
        socks = [socket.socket(fileno=fd) for fd in received.fds]
        received.fds = []
        count = len(state.sockets)
        self.listener_socks = socks[:count]
        """In worker mode, the members of each listener's group (the new pool owns them)."""
        single = state.workers == 0
        self.sockets = HandedSockets(
            state.sockets if single else (), self.listener_socks if single else ()
        )
        self.relays = socks[count:]
        """The relay sockets, in the order the state names them (`TurnServer.adopt`)."""
        self.admin = received.named
        """The old process's health and metrics listening sockets (`AdminServers`)."""

    def confirm(self) -> None:
        """This process serves: the old one lets go and exits."""
        self.received.confirm()
        self.sockets.close()  # each listener serves its own duplicate
        log.info(
            "handoff: serving %d listener socket(s) and %d allocation(s) of the old process",
            len(self.sockets.taken),
            self.state.allocation_count(),
        )

    def refuse(self, reason: str) -> None:
        """This process cannot serve: the old one goes on."""
        self.received.refuse(reason)
        self.sockets.close()


async def successor_at(path: Path, workers: int) -> Successor | None:
    """What a stunnerd running at `path` hands over, for a process of `workers` worker
    processes (0: a single one); None when none runs there. Raises HandoffError (the old
    process serves on): refused, failed, or run with another number of workers."""
    taken = await asyncio.to_thread(take, path)
    if taken is None:
        return None
    successor = Successor(*taken)
    if successor.state.workers != workers:
        reason = (
            f"the running stunnerd has {successor.state.workers or 1} worker process(es), this "
            f"one {workers or 1}: start it with the same --udp-thread-num"
        )
        successor.refuse(reason)
        raise HandoffRefusedError(reason)
    return successor
