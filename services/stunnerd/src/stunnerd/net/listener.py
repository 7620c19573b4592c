"""One TURN listener at the asyncio edge: carries out engine effects and owns the fast path.

A `Listener` wraps one `TurnEngine`. Everything the engine decides arrives as effects, which
`apply` carries out: send to a client, send to a peer through the allocation's relay socket, open
or close a relay, and install or remove *channel routes*. Routes are the hot path (ChannelData,
RFC 8656 §12): the client-side table maps (client address, channel) to the relay socket and the
peer; each relay maps a peer address to its channel number. A datagram that hits a route is
forwarded with one dict lookup and no parsing, no logging, no task, through the shared
`SendBatcher` (UDP GSO for bursts); anything else goes to the engine. The engine's
`next_deadline()` arms a single `call_at` timer per listener.

Traffic counters are plain lists of four ints (`Traffic`: rx packets, rx bytes, tx packets, tx
bytes), one per listener and one per cluster, owned by the `TurnServer` so they survive listener
restarts. A route carries the list of the cluster that admitted its peer, resolved once when the
route is installed, so counting costs a few integer additions per datagram: no lookup by name,
no allocation, no lock (each worker process counts its own; the supervisor sums them).

Subclasses provide the client transport: UDP here, TCP/TLS in `stream.py`, DTLS in `dtls.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from stunner_common.config import TlsPair
from stunnerd.net.batch import SendBatcher
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import Policies, TurnEngine
from stunnerd.turn.policies import UserUsage

log = logging.getLogger(__name__)

Address = tuple[str, int]
SendTo = Callable[[bytes, Any], None]
Traffic = list[int]  # [rx packets, rx bytes, tx packets, tx bytes]
RX_PKTS, RX_BYTES, TX_PKTS, TX_BYTES = 0, 1, 2, 3
_CHANNEL_HEADER = struct.Struct("!HH").pack
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
EVEN_PORT_ATTEMPTS = 64
TRANSPORT_CLOSE_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """What the edge needs to run a listener (built from a `ListenerConfig`)."""

    name: str
    protocol: str  # TURN-UDP, TURN-TCP, TURN-TLS, TURN-DTLS
    relay_ip: str  # advertised in XOR-RELAYED-ADDRESS
    port: int
    bind_host: str = "0.0.0.0"
    tls: TlsPair | None = None
    reuse_port: bool = False  # share the port with other worker processes (SO_REUSEPORT)


def tune_udp_socket(sock: socket.socket) -> None:
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):  # the kernel caps it; never fatal
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)


def new_traffic() -> Traffic:
    return [0, 0, 0, 0]


def _wire_forms(addr: Address) -> tuple[Any, ...]:
    """The address tuples asyncio hands us for `addr`: IPv6 sockets add flowinfo and scope id."""
    if ":" in addr[0]:
        return (addr, (addr[0], addr[1], 0, 0))
    return (addr,)


class DatagramRelayProtocol(asyncio.DatagramProtocol):
    """The relay socket of one allocation; peer → client ChannelData goes out via `client_send`."""

    __slots__ = ("client", "client_send", "listener", "peer_channels", "sock", "transport")

    def __init__(self, listener: Listener, client: Address, sock: socket.socket) -> None:
        self.listener = listener
        self.client = client
        self.sock = sock  # the raw socket, for batched sends to peers
        self.client_send: SendTo = listener.client_sender(client)
        # peer address -> (channel number, traffic counters of the peer's cluster)
        self.peer_channels: dict[Any, tuple[int, Traffic]] = {}
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        hit = self.peer_channels.get(addr)
        if hit is not None:
            n = len(data)
            counts = hit[1]
            counts[0] += 1
            counts[1] += n
            self.client_send(_CHANNEL_HEADER(hit[0], n) + data, self.client)
            return
        self.listener.peer_slow_path(self.client, addr, data)

    def error_received(self, exc: Exception) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("relay for %s: %s", self.client, exc)


class UdpRelayProtocol(DatagramRelayProtocol):
    """Relay whose client speaks plain UDP: ChannelData to the client goes through the batcher."""

    __slots__ = ("client_sock", "send", "traffic")

    def __init__(self, listener: Listener, client: Address, sock: socket.socket) -> None:
        super().__init__(listener, client, sock)
        self.send = listener.batcher.send
        self.client_sock: socket.socket = listener.sock  # type: ignore[attr-defined]
        self.traffic = listener.traffic

    def datagram_received(self, data: bytes, addr: Any) -> None:
        hit = self.peer_channels.get(addr)
        if hit is not None:
            n = len(data)
            counts = hit[1]
            counts[0] += 1
            counts[1] += n
            counts = self.traffic
            counts[2] += 1
            counts[3] += n + 4
            self.send(self.client_sock, _CHANNEL_HEADER(hit[0], n) + data, self.client)
            return
        self.listener.peer_slow_path(self.client, addr, data)


class StreamRelayProtocol(DatagramRelayProtocol):
    """Relay whose client speaks a stream (TCP/TLS): ChannelData is padded to 4 bytes."""

    __slots__ = ()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        hit = self.peer_channels.get(addr)
        if hit is not None:
            n = len(data)
            counts = hit[1]
            counts[0] += 1
            counts[1] += n
            pad = -n % 4
            frame = _CHANNEL_HEADER(hit[0], n) + data
            self.client_send(frame + b"\x00" * pad if pad else frame, self.client)
            return
        self.listener.peer_slow_path(self.client, addr, data)


class Listener:
    """Base class: the engine, relays, channel routes and the deadline timer of one listener."""

    stream = False
    relay_class: type[DatagramRelayProtocol] = DatagramRelayProtocol

    def __init__(
        self,
        spec: ListenerSpec,
        policies: Policies,
        *,
        nonce_secret: bytes,
        usage: UserUsage,
        loop: asyncio.AbstractEventLoop,
        clock_offset_s: float,
        batcher: SendBatcher | None = None,
        traffic: Traffic | None = None,
        cluster_traffic: dict[str, Traffic] | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.loop = loop
        self.engine = TurnEngine(
            relay_ip=spec.relay_ip,
            nonce_secret=nonce_secret,
            policies=policies,
            usage=usage,
            stream=self.stream,
            clock_offset_s=clock_offset_s,
        )
        self.batcher = batcher if batcher is not None else SendBatcher(loop, enabled=False)
        self.traffic: Traffic = traffic if traffic is not None else new_traffic()
        self.cluster_traffic: dict[str, Traffic] = (
            cluster_traffic if cluster_traffic is not None else {}
        )
        self._unattributed = new_traffic()  # peers of a policy without named clusters
        # (client address, channel) -> (relay socket, peer, cluster counters): client → peer
        self.routes: dict[tuple[Any, int], tuple[socket.socket, Address, Traffic]] = {}
        self.relays: dict[Address, DatagramRelayProtocol] = {}
        self.held_ports: dict[int, socket.socket] = {}  # reservations (EVEN-PORT with R)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        self.connections_total = 0
        self.closed = False

    # -------------------------------------------------------------- subclass hooks

    async def start(self) -> None:
        raise NotImplementedError

    def client_sender(self, client: Address) -> SendTo:
        """A callable(data, client) that delivers bytes to this client."""
        raise NotImplementedError

    def send_to_client(self, client: Address, data: bytes) -> None:
        raise NotImplementedError

    async def _close_transport(self) -> None:
        raise NotImplementedError

    @property
    def bound_port(self) -> int:
        raise NotImplementedError

    # -------------------------------------------------------------- engine plumbing

    @property
    def allocation_count(self) -> int:
        return self.engine.allocation_count

    def set_policies(self, policies: Policies) -> None:
        self.apply(self.engine.set_policies(policies, self.loop.time()))
        self._recount_routes()

    def cluster_counts(self, peer: Address) -> Traffic:
        """The counters of the cluster that admits `peer` (created on first use)."""
        name = self.engine.policies.peers.cluster_of(peer[0], peer[1])
        if name is None:
            return self._unattributed
        counts = self.cluster_traffic.get(name)
        if counts is None:
            counts = self.cluster_traffic[name] = new_traffic()
        return counts

    def _recount_routes(self) -> None:
        """Routes that survive a policy change may now fall under another cluster."""
        for key, (sock, peer, _old) in list(self.routes.items()):
            self.routes[key] = (sock, peer, self.cluster_counts(peer))
        for relay in self.relays.values():
            for addr, (channel, _old) in list(relay.peer_channels.items()):
                relay.peer_channels[addr] = (channel, self.cluster_counts((addr[0], addr[1])))

    def client_slow_path(self, data: bytes, client: Any) -> None:
        """Everything that is not a routed ChannelData frame goes through the engine."""
        try:
            effects = self.engine.handle_client(data, (client[0], client[1]), self.loop.time())
        except Exception:  # the engine must never take the listener down
            log.exception("listener %s: engine failed on a client message", self.name)
            return
        if effects:
            self.apply(effects)

    def peer_slow_path(self, client: Address, peer: Any, data: bytes) -> None:
        addr = (peer[0], peer[1])
        try:
            effects = self.engine.handle_peer(client, addr, data, self.loop.time())
        except Exception:
            log.exception("listener %s: engine failed on a peer datagram", self.name)
            return
        if effects:  # only an admitted datagram yields effects (its Data indication)
            counts = self.cluster_counts(addr)
            counts[RX_PKTS] += 1
            counts[RX_BYTES] += len(data)
            self.apply(effects)

    def client_closed(self, client: Address) -> None:
        if not self.closed:
            self.apply(self.engine.client_closed(client, self.loop.time()))

    def apply(self, effects: list[fx.Effect]) -> None:
        for effect in effects:
            match effect:
                case fx.SendToClient():
                    self.send_to_client(effect.client, effect.data)
                case fx.SendToPeer():
                    relay = self.relays.get(effect.client)
                    if relay is not None and relay.transport is not None:
                        counts = self.cluster_counts(effect.peer)
                        counts[TX_PKTS] += 1
                        counts[TX_BYTES] += len(effect.data)
                        self.batcher.send(relay.sock, effect.data, effect.peer)
                case fx.ChannelRouteAdded():
                    self._route_added(effect)
                case fx.ChannelRouteRemoved():
                    self._route_removed(effect)
                case fx.OpenRelay():
                    self._open_relay(effect)
                case fx.ReleasePort():
                    released = self.held_ports.pop(effect.port, None)
                    if released is not None:
                        released.close()
                case fx.CloseRelay():
                    closing = self.relays.pop(effect.client, None)
                    if closing is not None and closing.transport is not None:
                        closing.transport.close()
                case fx.AllocationCreated():
                    log.info(
                        "listener %s: allocation for %s (user %s) relay %s:%d lifetime %ds",
                        self.name,
                        effect.client,
                        effect.user_id,
                        effect.relay[0],
                        effect.relay[1],
                        effect.lifetime_s,
                    )
                case fx.AllocationDeleted():
                    log.info(
                        "listener %s: allocation for %s (user %s) deleted: %s",
                        self.name,
                        effect.client,
                        effect.user_id,
                        effect.reason,
                    )
        self._rearm()

    def _route_added(self, effect: fx.ChannelRouteAdded) -> None:
        relay = self.relays.get(effect.client)
        if relay is None or relay.transport is None:
            return
        counts = self.cluster_counts(effect.peer)
        route = (relay.sock, effect.peer, counts)
        for client in _wire_forms(effect.client):
            self.routes[(client, effect.channel)] = route
        for peer in _wire_forms(effect.peer):
            relay.peer_channels[peer] = (effect.channel, counts)

    def _route_removed(self, effect: fx.ChannelRouteRemoved) -> None:
        for client in _wire_forms(effect.client):
            self.routes.pop((client, effect.channel), None)
        relay = self.relays.get(effect.client)
        if relay is not None:
            for peer in _wire_forms(effect.peer):
                relay.peer_channels.pop(peer, None)

    def _open_relay(self, effect: fx.OpenRelay) -> None:
        held: socket.socket | None = None
        try:
            if effect.reserved_port:
                sock = self.held_ports.pop(effect.reserved_port, None)
                if sock is None:
                    raise OSError(f"reserved port {effect.reserved_port} is gone")
            elif effect.reserve_next:
                sock, held = self._bind_even_pair(effect.family)
            else:
                sock = self._bind_relay_socket(effect.family, effect.even_port)
        except OSError as exc:
            log.warning("listener %s: cannot open a relay socket: %s", self.name, exc)
            self.apply(self.engine.relay_failed(effect.client, self.loop.time()))
            return
        task = self.loop.create_task(
            self._start_relay(effect.client, sock, held), name=f"relay-open:{self.name}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _relay_host(self, family: int) -> tuple[socket.AddressFamily, str]:
        af = socket.AF_INET6 if family == 6 else socket.AF_INET
        host = self.spec.bind_host
        if (af == socket.AF_INET6) != (":" in host):
            host = "::" if af == socket.AF_INET6 else "0.0.0.0"
        return af, host

    def _bind_relay_socket(self, family: int, even: bool, port: int = 0) -> socket.socket:
        af, host = self._relay_host(family)
        for _ in range(EVEN_PORT_ATTEMPTS if even else 1):
            sock = socket.socket(af, socket.SOCK_DGRAM)
            try:
                sock.setblocking(False)
                sock.bind((host, port))
            except OSError:
                sock.close()
                raise
            if not even or sock.getsockname()[1] % 2 == 0:
                tune_udp_socket(sock)
                return sock
            sock.close()
        raise OSError("no even relay port found")

    def _bind_even_pair(self, family: int) -> tuple[socket.socket, socket.socket]:
        """An even relay port P and a socket held on P + 1 (EVEN-PORT with R, RFC 8656 §14.6)."""
        for _ in range(EVEN_PORT_ATTEMPTS):
            sock = self._bind_relay_socket(family, True)
            try:
                return sock, self._bind_relay_socket(family, False, sock.getsockname()[1] + 1)
            except OSError:
                sock.close()
        raise OSError("no free pair of relay ports found")

    async def _start_relay(
        self, client: Address, sock: socket.socket, held: socket.socket | None = None
    ) -> None:
        port = int(sock.getsockname()[1])
        factory = self.relay_class
        try:
            _transport, relay = await self.loop.create_datagram_endpoint(
                lambda: factory(self, client, sock), sock=sock
            )
        except OSError as exc:
            sock.close()
            if held is not None:
                held.close()
            log.warning("listener %s: relay socket failed: %s", self.name, exc)
            self.apply(self.engine.relay_failed(client, self.loop.time()))
            return
        if self.closed:
            relay.transport.close()  # type: ignore[union-attr]
            if held is not None:
                held.close()
            return
        self.relays[client] = relay
        held_port = 0
        if held is not None:
            held_port = int(held.getsockname()[1])
            self.held_ports[held_port] = held
        self.apply(self.engine.relay_opened(client, port, self.loop.time(), held_port))

    def _rearm(self) -> None:
        deadline = self.engine.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None and not self.closed:
            self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.apply(self.engine.tick(self.loop.time()))

    async def close(self) -> None:
        """Stop serving: drop allocations (relays close), stop the transport, cancel tasks."""
        if self.closed:
            return
        self.apply(self.engine.close())
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for relay in self.relays.values():
            if relay.transport is not None:
                relay.transport.close()
        self.relays.clear()
        self.routes.clear()
        for held in self.held_ports.values():
            held.close()
        self.held_ports.clear()
        await self._close_transport()


class ClosingDatagramProtocol(asyncio.DatagramProtocol):
    """Resolves `closed` once the transport has really released its socket (and its port)."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    async def wait_closed(self) -> None:
        """asyncio closes a datagram socket one loop turn after `close()`; a listener that
        restarts on the same port must wait for that, or its bind fails with EADDRINUSE."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TRANSPORT_CLOSE_TIMEOUT_S):
                await asyncio.shield(self.closed)


_P = TypeVar("_P", bound="ClosingDatagramProtocol")


async def open_listener_socket(
    loop: asyncio.AbstractEventLoop, spec: ListenerSpec, factory: Callable[[], _P]
) -> tuple[socket.socket, asyncio.DatagramTransport, _P]:
    """Bind the UDP socket of a TURN-UDP or TURN-DTLS listener (shared with the other workers
    when `reuse_port`) and wrap it in a datagram endpoint; the socket is closed on failure."""
    family = socket.AF_INET6 if ":" in spec.bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        if spec.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((spec.bind_host, spec.port))
        tune_udp_socket(sock)
        transport, protocol = await loop.create_datagram_endpoint(factory, sock=sock)
    except BaseException:
        sock.close()
        raise
    return sock, transport, protocol


class UdpListenerProtocol(ClosingDatagramProtocol):
    """TURN-UDP: routed ChannelData is forwarded right here; the rest goes to the engine."""

    __slots__ = ("routes", "send", "slow_path", "traffic")

    def __init__(self, listener: UdpListener) -> None:
        super().__init__()
        self.routes = listener.routes
        self.send = listener.batcher.send
        self.slow_path = listener.client_slow_path
        self.traffic = listener.traffic

    def datagram_received(self, data: bytes, addr: Any) -> None:
        size = len(data)
        counts = self.traffic
        counts[0] += 1
        counts[1] += size
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
    relay_class = UdpRelayProtocol

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.transport: asyncio.DatagramTransport | None = None
        self.protocol: UdpListenerProtocol | None = None
        self.sock: socket.socket | None = None
        self._sendto: SendTo | None = None

    async def start(self) -> None:
        sock, transport, protocol = await open_listener_socket(
            self.loop, self.spec, lambda: UdpListenerProtocol(self)
        )
        self.protocol = protocol
        self.transport = transport
        self.sock = sock
        self._sendto = transport.sendto
        self.connections = self.connections_total = 1

    @property
    def bound_port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def client_sender(self, client: Address) -> SendTo:
        assert self._sendto is not None
        return self._sendto

    def send_to_client(self, client: Address, data: bytes) -> None:
        if self._sendto is not None:
            counts = self.traffic
            counts[TX_PKTS] += 1
            counts[TX_BYTES] += len(data)
            self._sendto(data, client)

    async def _close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
            self._sendto = None
            if self.protocol is not None:
                await self.protocol.wait_closed()
