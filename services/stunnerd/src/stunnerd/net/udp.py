"""TURN-UDP: the listener whose clients send plain datagrams, and the client → peer fast path.

Where the server was given the C relay (`stunnerd.net.ports.FastPathPort`), it reads the listener
and relay sockets instead of the event loop and relays bound channels itself; the listener's
channel routes are mirrored into it (and into the kernel offload's maps, `OffloadPort`) as
`route_table` tables, and what it does not route comes back to `client_slow_path` and the relay
protocols.

Also the listener sockets that TURN-UDP and TURN-DTLS share: bound with SO_REUSEPORT when several
worker processes serve one port, and closed only once the kernel released the port.

`UdpListenerProtocol.datagram_received` is the hottest function of the server: a ChannelData
datagram (first byte 0x40-0x7F) whose (client address, channel) has a route is counted and handed
to the `SendBatcher` for the relay socket with one dict lookup; everything else goes to the engine.
With the C relay, the first Allocate of each allocation (no credentials yet) is answered there
with the engine's 401, renewed every second with a fresh nonce (`_renew_challenge`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from stunnerd.net.adopt import open_adopted
from stunnerd.net.binding import allow_both_families
from stunnerd.net.listener import Listener, ListenerSpec
from stunnerd.net.ports import OffloadPort
from stunnerd.net.relay import (
    TX_BYTES,
    TX_PKTS,
    Address,
    DatagramRelayProtocol,
    FastRelayTransport,
    SendTo,
    UdpRelayProtocol,
    tune_udp_socket,
)
from stunnerd.turn.guard import CHALLENGE_SOURCES_MAX
from stunnerd.turn.policies import Policies

log = logging.getLogger(__name__)

CHALLENGE_RENEW_S = 1.0
"""How often the C relay's 401 (`FastPath.answer_challenges`) is given a fresh nonce..."""
CHALLENGE_VALID_S = 5.0
"""...and how long it answers with one not renewed (the event loop busy or stopped): then the
engine answers, each challenge with a nonce of its own, as a listener without the C relay."""


class ClosingDatagramProtocol(asyncio.DatagramProtocol):
    """Resolves `closed` once the transport has really released its socket (and its port)."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    async def wait_closed(self, timeout_s: float) -> None:
        """asyncio closes a datagram socket one loop turn after `close()`; a listener that
        restarts on the same port must wait for that, or its bind fails with EADDRINUSE."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self.closed)


_P = TypeVar("_P", bound="ClosingDatagramProtocol")


async def close_endpoint(
    transport: asyncio.DatagramTransport, protocol: ClosingDatagramProtocol | None, timeout_s: float
) -> None:
    """Close a listener's datagram transport and wait until the kernel released its port."""
    transport.close()
    if protocol is not None:
        await protocol.wait_closed(timeout_s)


def bind_listener_socket(spec: ListenerSpec) -> socket.socket:
    """The UDP socket of a TURN-UDP or TURN-DTLS listener, bound (with SO_REUSEPORT when other
    workers share the port) and non-blocking."""
    family = socket.AF_INET6 if ":" in spec.bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        if spec.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        allow_both_families(sock, spec.bind_host)
        sock.bind((spec.bind_host, spec.port))
        tune_udp_socket(sock)
    except BaseException:
        sock.close()
        raise
    return sock


def _raw_sendto(sock: socket.socket) -> SendTo:
    """Send on a socket no transport owns; a full buffer drops the datagram, as UDP may."""
    send = sock.sendto

    def sendto(data: bytes, addr: Any) -> None:
        try:
            send(data, addr)
        except OSError:
            return

    return sendto


async def open_listener_socket(
    loop: asyncio.AbstractEventLoop,
    spec: ListenerSpec,
    factory: Callable[[], _P],
    inherited: socket.socket | None = None,
) -> tuple[socket.socket, asyncio.DatagramTransport, _P]:
    """Bind the UDP socket of a TURN-UDP or TURN-DTLS listener, or take the `inherited` one the
    worker supervisor bound, and wrap it in a datagram endpoint; the socket is closed on failure."""
    sock = inherited if inherited is not None else bind_listener_socket(spec)
    try:
        transport, protocol = await loop.create_datagram_endpoint(factory, sock=sock)
    except BaseException:
        sock.close()
        raise
    return sock, transport, protocol


class UdpListenerProtocol(ClosingDatagramProtocol):
    """TURN-UDP: routed ChannelData is forwarded right here; the rest goes to the engine."""

    __slots__ = ("max_datagram", "refusals", "routes", "send", "slow_path", "traffic")

    def __init__(self, listener: UdpListener) -> None:
        super().__init__()
        self.max_datagram = listener.limits.request.max_udp_datagram_bytes
        self.refusals = listener.engine.refusals
        self.routes = listener.routes
        self.send = listener.batcher.send
        self.slow_path = listener.client_slow_path
        self.traffic = listener.traffic

    def datagram_received(self, data: bytes, addr: Any) -> None:
        size = len(data)
        counts = self.traffic
        counts[0] += 1
        counts[1] += size
        if size > self.max_datagram:
            self.refusals.limited("udp_datagram_bytes")
            return  # as the C relay, which reads no more than this
        if size >= 4 and 0x40 <= data[0] <= 0x7F:
            route = self.routes.get((addr, (data[0] << 8) | data[1]))
            if route is not None:
                n = (data[2] << 8) | data[3]
                if n <= size - 4:
                    counts = route[2]
                    counts[2] += 1
                    counts[3] += n
                    self.send(route[0], data[4 : 4 + n], route[1])
                    return
        self.slow_path(data, addr)

    def error_received(self, exc: Exception) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("UDP listener socket error: %s", exc)


class UdpListener(Listener):
    stream = False
    allocations_are_connections = True
    journaled = True
    relay_class = UdpRelayProtocol

    def __init__(self, *args: Any, offload: OffloadPort | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.transport: asyncio.DatagramTransport | None = None
        self.protocol: UdpListenerProtocol | None = None
        self.sock: socket.socket | None = None
        self._sendto: SendTo | None = None
        self._challenge_timer: asyncio.TimerHandle | None = None
        self.offload = offload  # the kernel fast path mirrors this listener's channel routes

    async def start(self) -> None:
        """Serve the listener's socket; allocations adopted from another process (`net.adopt`)
        get their relays and routes before the first datagram is read, so none of their
        ChannelData waiting in the socket's queue meets a listener without its route."""
        inherited, self.inherited_socket = self.inherited_socket, None
        self.sock = sock = inherited or bind_listener_socket(self.spec)
        self._sendto = _raw_sendto(sock)
        try:
            if self.fastpath is not None:
                # The C relay reads the socket and drops junk; what it does not route comes to
                # the engine.
                self.fastpath.watch_listener(
                    sock,
                    self.traffic,
                    self.client_slow_path,
                    max_stun_bytes=self.limits.request.max_message_bytes,
                    max_datagram_bytes=self.limits.request.max_udp_datagram_bytes,
                )
                self.fastpath.answer_binding(sock, self.engine.software)
                limits = self.engine.limits
                budget = self.fastpath.challenge_budget(
                    sock, limits.challenge_rate_per_s, limits.challenge_burst, CHALLENGE_SOURCES_MAX
                )
                self.engine.use_challenge_budget(budget)
                self._renew_challenge()
                self.channel_routes.add_table(self.fastpath.routes(sock))
            if self.offload is not None:
                listener_addr = (self.spec.bind_host, self.bound_port)
                table = self.offload.routes(self.name, listener_addr, self.traffic)
                self.channel_routes.add_table(table)
            await open_adopted(self)
            if self.fastpath is None:
                self.transport, self.protocol = await self.loop.create_datagram_endpoint(
                    lambda: UdpListenerProtocol(self), sock=sock
                )
                self._sendto = self.transport.sendto
        except BaseException:
            if self.fastpath is None and self.transport is None:  # else `close` releases it
                self.sock = self._sendto = None
                sock.close()
            raise

    def _renew_challenge(self) -> None:
        """Give the C relay the engine's 401 with a fresh nonce (`FastPath.answer_challenges`),
        and again in `CHALLENGE_RENEW_S`."""
        if self._challenge_timer is not None:
            self._challenge_timer.cancel()
            self._challenge_timer = None
        if self.fastpath is None or self.sock is None or self.closed:
            return
        template = self.engine.challenge_template(self.loop.time())
        self.fastpath.answer_challenges(self.sock, template, CHALLENGE_VALID_S)
        self._challenge_timer = self.loop.call_later(CHALLENGE_RENEW_S, self._renew_challenge)

    def set_policies(self, policies: Policies) -> None:
        super().set_policies(policies)
        if self._challenge_timer is not None:  # the realm, or auth turned off, applies at once
            self._renew_challenge()

    @property
    def bound_port(self) -> int:
        assert self.sock is not None
        return int(self.sock.getsockname()[1])

    async def open_relay_endpoint(
        self, client: Address, sock: socket.socket
    ) -> DatagramRelayProtocol:
        if self.fastpath is None:
            return await super().open_relay_endpoint(client, sock)
        relay = self.relay_class(self, client, sock)
        relay.connection_made(FastRelayTransport(sock, self.fastpath))
        self.fastpath.watch_relay(sock, self.traffic, relay.datagram_received)
        return relay

    def client_sender(self, client: Address) -> SendTo:
        assert self._sendto is not None
        return self._sendto

    def client_socket(self) -> socket.socket | None:
        return self.sock

    def send_to_client(self, client: Address, data: bytes) -> None:
        if self._sendto is not None:
            counts = self.traffic
            counts[TX_PKTS] += 1
            counts[TX_BYTES] += len(data)
            self._sendto(data, client)

    def fold_refusals(self) -> None:
        if self.fastpath is not None and self.sock is not None:
            oversized, truncated, suppressed = self.fastpath.take_drops(self.sock)
            refusals = self.engine.refusals
            if oversized:
                refusals.limited("message_bytes", oversized)
            if truncated:
                refusals.limited("udp_datagram_bytes", truncated)
            if suppressed:
                self.engine.count_suppressed_challenges(suppressed)

    async def _close_transport(self) -> None:
        if self._challenge_timer is not None:
            self._challenge_timer.cancel()
            self._challenge_timer = None
        if self.fastpath is not None and self.sock is not None:
            self.fold_refusals()
            self.fastpath.unwatch(self.sock)
            self.sock.close()
            self.sock = None
            self._sendto = None
        transport, self.transport = self.transport, None
        if transport is not None:
            self._sendto = None
            await close_endpoint(transport, self.protocol, self.tuning.socket_close_timeout_s)
