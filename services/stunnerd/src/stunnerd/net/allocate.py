"""The edge's half of a two-phase Allocate: the engine asks for a relay, the edge opens it.

An `OpenRelay` effect names what the allocation needs (RFC 8656 §7.2): a UDP socket of one
family, on an even port (§14.6) and with the next port held for a later Allocate (EVEN-PORT
with R), the socket a RESERVATION-TOKEN names, or a second socket of the other family (a dual
allocation). `RelayOpener` binds them, wraps them in relay protocols and reports back to the
engine with `relay_opened` or `relay_failed`; the listener's `relays`, `dual_relays` and
`held_ports` hold the result. Where the cluster-wide user quota enforces a limit, its lease is
taken first (one Redis call, in a task) and a refusal is answered 486; the leases of this
listener's allocations are renewed and released here as the engine reports their fate.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Protocol

from stunnerd.net.ports import QuotaLeases
from stunnerd.net.relay import (
    Address,
    DatagramRelayProtocol,
    bind_even_pair,
    bind_relay_socket,
)
from stunnerd.net.tasks import TaskSet
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import TurnEngine

log = logging.getLogger(__name__)


class RelayHost(Protocol):
    """What opening relays needs from its listener."""

    name: str
    loop: asyncio.AbstractEventLoop
    engine: TurnEngine
    closed: bool
    quota: QuotaLeases | None
    relays: dict[Address, DatagramRelayProtocol]
    dual_relays: dict[Address, DatagramRelayProtocol]
    held_ports: dict[int, socket.socket]

    def apply(self, effects: list[fx.Effect]) -> None:
        """Carry out the engine's answer."""

    def tcp_relay_effect(self, effect: fx.TcpRelayEffect) -> None:
        """An RFC 6062 relay (a listening TCP socket) instead of a UDP one."""

    async def open_relay_endpoint(
        self, client: Address, sock: socket.socket
    ) -> DatagramRelayProtocol:
        """The protocol of a new relay socket, reading it."""


class RelayOpener:
    """Opens the UDP relay sockets of one listener's allocations, after the quota admits them."""

    # Where relay sockets come from (RFC 8656 §14.6); the unit tests bind none.
    bind_socket = staticmethod(bind_relay_socket)
    bind_pair = staticmethod(bind_even_pair)

    def __init__(self, host: RelayHost, bind_host: str) -> None:
        self.host = host
        self.bind_host = bind_host
        self.tasks = TaskSet(host.loop)
        self.leases: dict[Address, str] = {}  # cluster-wide quota leases by allocation

    def open(self, effect: fx.OpenRelay) -> None:
        quota = self.host.quota
        if quota is not None and quota.enforcing:
            self.tasks.spawn(self._admit_then_open(quota, effect), f"quota:{self.host.name}")
        else:
            self._open(effect)

    def _failed(
        self, client: Address, code: int | None = None, reason: str = "", limit: str = ""
    ) -> None:
        host = self.host
        now = host.loop.time()
        if code is None:
            host.apply(host.engine.relay_failed(client, now))
        else:
            host.apply(host.engine.relay_failed(client, now, code, reason, limit))

    # ---------------------------------------------------------- the cluster-wide quota

    async def _admit_then_open(self, quota: QuotaLeases, effect: fx.OpenRelay) -> None:
        """The cluster-wide quota first (one Redis call), then the relay; 486 when refused."""
        lease = quota.lease_id(self.host.name, effect.client)
        admitted = await quota.acquire(effect.user_id, lease, effect.lifetime_s)
        if self.host.closed:
            quota.release(lease)
            return
        if not admitted:
            log.info(
                "listener %s: allocation for %s (user %s) refused: cluster-wide quota of %d",
                self.host.name,
                effect.client,
                effect.user_id,
                quota.limit,
            )
            self._failed(effect.client, 486, "Allocation Quota Reached", "user_quota")
            return
        self.release_lease(effect.client)  # a previous allocation's, should one linger
        self.leases[effect.client] = lease
        self._open(effect)

    def renew_lease(self, client: Address, lifetime_s: float) -> None:
        quota = self.host.quota
        if self.leases and quota is not None:
            lease = self.leases.get(client)
            if lease is not None:
                quota.renew(lease, lifetime_s)

    def release_lease(self, client: Address) -> None:
        quota = self.host.quota
        if self.leases and quota is not None:
            lease = self.leases.pop(client, None)
            if lease is not None:
                quota.release(lease)

    # ---------------------------------------------------------- sockets

    def _open(self, effect: fx.OpenRelay) -> None:
        if effect.tcp:
            self.host.tcp_relay_effect(effect)
            return
        try:
            sock, held, dual = self._bind(effect)
        except OSError as exc:
            log.warning("listener %s: cannot open a relay socket: %s", self.host.name, exc)
            self._failed(effect.client)
            return
        self.tasks.spawn(
            self._start(effect.client, sock, held, dual), f"relay-open:{self.host.name}"
        )

    def _bind(
        self, effect: fx.OpenRelay
    ) -> tuple[socket.socket, socket.socket | None, socket.socket | None]:
        """The relay socket, the one held for a later Allocate and the dual allocation's."""
        held: socket.socket | None = None
        if effect.reserved_port:
            sock = self.host.held_ports.pop(effect.reserved_port, None)
            if sock is None:
                raise OSError(f"reserved port {effect.reserved_port} is gone")
        elif effect.reserve_next:
            sock, held = self.bind_pair(self.bind_host, effect.family)
        else:
            sock = self.bind_socket(self.bind_host, effect.family, effect.even_port)
        if not effect.additional_family:
            return sock, held, None
        try:
            return sock, held, self.bind_socket(self.bind_host, effect.additional_family, False)
        except OSError:
            sock.close()
            raise

    async def _start(
        self,
        client: Address,
        sock: socket.socket,
        held: socket.socket | None = None,
        dual: socket.socket | None = None,
    ) -> None:
        host = self.host
        port = int(sock.getsockname()[1])
        try:
            relay, dual_relay = await self._endpoints(client, sock, dual)
        except OSError as exc:
            for unused in (sock, held, dual):
                if unused is not None:
                    unused.close()
            log.warning("listener %s: relay socket failed: %s", host.name, exc)
            self._failed(client)
            return
        if host.closed:
            for opened in (relay, dual_relay):
                if opened is not None and opened.transport is not None:
                    opened.transport.close()
            if held is not None:
                held.close()
            return
        host.relays[client] = relay
        dual_port = 0
        if dual_relay is not None:
            host.dual_relays[client] = dual_relay
            dual_port = int(dual_relay.sock.getsockname()[1])
        held_port = 0
        if held is not None:
            held_port = int(held.getsockname()[1])
            host.held_ports[held_port] = held
        host.apply(host.engine.relay_opened(client, port, host.loop.time(), held_port, dual_port))

    async def _endpoints(
        self, client: Address, sock: socket.socket, dual: socket.socket | None
    ) -> tuple[DatagramRelayProtocol, DatagramRelayProtocol | None]:
        relay = await self.host.open_relay_endpoint(client, sock)
        if dual is None:
            return relay, None
        try:
            return relay, await self.host.open_relay_endpoint(client, dual)
        except BaseException:
            relay.transport.close()  # type: ignore[union-attr]
            raise
