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

Subclasses provide the client transport: UDP in `udp.py`, TCP/TLS in `stream.py`, DTLS in
`dtls.py`; relays are opened by `allocate.RelayOpener`, and the relay sockets and the peer →
client half of the fast path are in `relay.py`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stunner_common.config import TlsPair
from stunnerd.net import adopt
from stunnerd.net.allocate import RelayOpener
from stunnerd.net.batch import SendBatcher
from stunnerd.net.guard import ClientLimits
from stunnerd.net.ports import AllocationJournal, FastPathPort, QuotaLeases
from stunnerd.net.relay import (
    RX_BYTES,
    RX_PKTS,
    TX_BYTES,
    TX_PKTS,
    Address,
    DatagramRelayProtocol,
    SendTo,
    Traffic,
    new_traffic,
)
from stunnerd.net.tuning import ServerTuning
from stunnerd.route_table.channels import ChannelRoutes
from stunnerd.route_table.python import ClientRoutes, PythonRoutes
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import Policies, TurnEngine
from stunnerd.turn.policies import UserUsage

__all__ = [
    "Address",
    "Listener",
    "ListenerContext",
    "ListenerOptions",
    "ListenerSpec",
    "SendTo",
    "Traffic",
    "new_traffic",
]

log = logging.getLogger(__name__)

DEFAULT_TUNING = ServerTuning()


@dataclass(frozen=True, slots=True)
class ListenerOptions:
    """The settings every listener of a server runs with: one value, shared by all of them."""

    limits: ClientLimits = field(default_factory=ClientLimits)
    """What bounds unauthenticated clients (`STUNNERD_MAX_CONNECTIONS_PER_SOURCE`, ...)."""
    tuning: ServerTuning = DEFAULT_TUNING
    """Timeouts and switches of its sockets (`STUNNERD_CLIENT_IDLE_TIMEOUT_S`, ...)."""
    tcp_relays: bool = True
    """RFC 6062 relays on TCP/TLS listeners (off in worker processes)."""


@dataclass(frozen=True, slots=True)
class ListenerContext:
    """What a server shares with each of its listeners: the event loop and its offset to wall
    time, the process-wide user usage, the send batcher and the counters by cluster name."""

    loop: asyncio.AbstractEventLoop
    usage: UserUsage
    clock_offset_s: float = 0.0
    batcher: SendBatcher | None = None
    """None: the listener sends through a batcher of its own, without GSO."""
    cluster_traffic: dict[str, Traffic] = field(default_factory=dict)


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
    other_relay_ip: str = ""  # a relay address of the other family (dual allocations)


class Listener:
    """Base class: the engine, relays, channel routes and the deadline timer of one listener."""

    stream = False
    relay_class: type[DatagramRelayProtocol] = DatagramRelayProtocol

    allocations_are_connections = False
    """TURN-UDP has no connections of its own: there a client holding an allocation is one."""

    journaled = False
    """Whether its allocations can outlive the process (TURN-UDP: nothing but the relay socket
    and the state hold them; a stream or DTLS client's connection dies with the process)."""

    def __init__(
        self,
        spec: ListenerSpec,
        policies: Policies,
        options: ListenerOptions,
        context: ListenerContext,
        *,
        nonce_secret: bytes,
        traffic: Traffic | None = None,
    ) -> None:
        self.spec = spec
        self.options = options
        self.tuning = tuning = options.tuning
        self.limits = options.limits
        self.name = spec.name
        self.loop = loop = context.loop
        self.engine = TurnEngine(
            relay_ip=spec.relay_ip,
            other_relay_ip=spec.other_relay_ip,
            nonce_secret=nonce_secret,
            policies=policies,
            usage=context.usage,
            stream=self.stream,
            clock_offset_s=context.clock_offset_s,
            limits=self.limits.request,
            tcp_relays=options.tcp_relays and self.stream,
            max_tcp_connections=tuning.max_tcp_connections_per_allocation,
        )
        self.engine.refusals.listener = self.name
        self.batcher = (
            context.batcher if context.batcher is not None else SendBatcher(loop, enabled=False)
        )
        self.traffic: Traffic = traffic if traffic is not None else new_traffic()
        self.cluster_traffic: dict[str, Traffic] = context.cluster_traffic
        self._unattributed = new_traffic()  # peers of a policy without named clusters
        # (client address, channel) -> (relay socket, peer, cluster counters): client → peer
        self.routes: ClientRoutes = {}
        # every copy of the channel routes (the C relay and the kernel add theirs at start)
        self.channel_routes = ChannelRoutes(
            self.relay_for, self.cluster_counts, PythonRoutes(self.routes)
        )
        self.relays: dict[Address, DatagramRelayProtocol] = {}
        # The IPv6 relay of each dual allocation (RFC 8656 §7.2); `relays` holds its IPv4 one.
        self.dual_relays: dict[Address, DatagramRelayProtocol] = {}
        self.held_ports: dict[int, socket.socket] = {}  # reservations (EVEN-PORT with R)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.connections = 0
        self.connections_total = 0
        self.closed = False
        # A socket bound elsewhere (the worker supervisor's SO_REUSEPORT member) to serve
        # instead of binding one; the listener owns it from `start` on.
        self.inherited_socket: socket.socket | None = None
        # The C relay of established channels (TURN-UDP only), set by the server before start.
        self.fastpath: FastPathPort | None = None
        # The cluster-wide user quota, set by the server before start.
        self.quota: QuotaLeases | None = None
        self.opener = RelayOpener(self, spec.bind_host)
        # Where allocations are journaled (a worker's supervisor), and the relay sockets of
        # allocations adopted from another process until `start` opens them (`net.adopt`).
        self.journal: AllocationJournal | None = None
        self.adopted: dict[Address, tuple[socket.socket, socket.socket | None]] = {}
        self.frozen = False  # requests are left to the process a handoff goes to
        self._handlers = self._effect_handlers()

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

    def client_socket(self) -> socket.socket | None:
        """The listener's UDP socket, where relays can send to clients directly (TURN-UDP)."""
        return None

    @property
    def bound_port(self) -> int:
        raise NotImplementedError

    def recount_tcp_relays(self) -> None:
        """Stream listeners: their TCP relays' peer connections may change cluster too."""

    def fold_refusals(self) -> None:
        """Add what the C relay dropped by a limit on this listener's socket to its engine's
        refusals (TURN-UDP)."""

    def tcp_relay_effect(self, effect: fx.TcpRelayEffect) -> None:
        """RFC 6062 effects; only stream listeners get them (their engine may open TCP relays)."""
        if isinstance(effect, fx.OpenRelay):
            self.apply(self.engine.relay_failed(effect.client, self.loop.time()))

    # -------------------------------------------------------------- engine plumbing

    @property
    def allocation_count(self) -> int:
        return self.engine.allocation_count

    def set_policies(self, policies: Policies) -> None:
        self.apply(self.engine.set_policies(policies, self.loop.time()))
        self._recount_routes()

    @property
    def bind_host(self) -> str:
        return self.spec.bind_host

    def cluster_counts(self, peer: Address) -> Traffic:
        """The counters of the cluster that admits `peer` (created on first use)."""
        name = self.engine.policies.peers.cluster_of(peer[0], peer[1])
        if name is None:
            return self._unattributed
        counts = self.cluster_traffic.get(name)
        if counts is None:
            counts = self.cluster_traffic[name] = new_traffic()
        return counts

    def relay_for(self, client: Address, peer_ip: str) -> DatagramRelayProtocol | None:
        """The relay of `client`'s allocation that serves peers of `peer_ip`'s family."""
        if ":" in peer_ip and self.dual_relays:
            dual = self.dual_relays.get(client)
            if dual is not None:
                return dual
        return self.relays.get(client)

    def _recount_routes(self) -> None:
        """Routes that survive a policy change may now fall under another cluster."""
        self.recount_tcp_relays()
        self.channel_routes.recount()

    def client_slow_path(self, data: bytes, client: Any) -> None:
        """Everything that is not a routed ChannelData frame goes through the engine."""
        if self.frozen and adopt.is_request(data):
            return  # a handoff is being prepared: the client retransmits to the next process
        address = (client[0], client[1])
        try:
            effects = self.engine.handle_client(data, address, self.loop.time())
        except Exception:  # the engine must never take the listener down
            log.exception("listener %s: engine failed on a client message", self.name)
            return
        if effects:
            self.apply(effects)
        if self.journal is not None and adopt.is_request(data):
            adopt.journal(self, address)  # what the request changed is kept

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
        """Carry out the engine's effects, then re-arm the deadline timer."""
        handlers = self._handlers
        for effect in effects:
            handler = handlers.get(type(effect))
            if handler is not None:
                handler(effect)
        self._rearm()

    def _effect_handlers(self) -> dict[type[Any], Callable[[Any], None]]:
        """Each effect's handler, bound once (subclasses override the methods, not this)."""
        tcp = self.tcp_relay_effect
        return {
            fx.SendToClient: self._send_to_client,
            fx.SendToPeer: self._send_to_peer,
            fx.ChannelRouteAdded: self.channel_routes.added,
            fx.ChannelRouteRemoved: self.channel_routes.removed,
            fx.OpenRelay: self.opener.open,
            fx.ReleasePort: self._release_port,
            fx.CloseRelay: self._close_relay,
            fx.ConnectPeer: tcp,
            fx.BindPeerConnection: tcp,
            fx.ClosePeerConnection: tcp,
            fx.AllocationCreated: self._allocation_created,
            fx.AllocationRefreshed: self._allocation_refreshed,
            fx.AllocationAborted: self._allocation_aborted,
            fx.AllocationDeleted: self._allocation_deleted,
        }

    def _send_to_client(self, effect: fx.SendToClient) -> None:
        self.send_to_client(effect.client, effect.data)

    def _send_to_peer(self, effect: fx.SendToPeer) -> None:
        relay = self.relay_for(effect.client, effect.peer[0])
        if relay is not None and relay.transport is not None:
            counts = self.cluster_counts(effect.peer)
            counts[TX_PKTS] += 1
            counts[TX_BYTES] += len(effect.data)
            self.batcher.send(relay.sock, effect.data, effect.peer)

    def _release_port(self, effect: fx.ReleasePort) -> None:
        released = self.held_ports.pop(effect.port, None)
        if released is not None:
            released.close()

    def _close_relay(self, effect: fx.CloseRelay) -> None:
        closing = self.relays.pop(effect.client, None)
        dual = self.dual_relays.pop(effect.client, None)
        if dual is not None and dual.transport is not None:
            dual.transport.close()
        if closing is not None and closing.transport is not None:
            closing.transport.close()
        elif self.stream:
            self.tcp_relay_effect(effect)

    def _allocation_created(self, effect: fx.AllocationCreated) -> None:
        if self.allocations_are_connections:
            self.connections += 1
            self.connections_total += 1
        log.info(
            "listener %s: allocation for %s (user %s) relay %s:%d%s lifetime %ds",
            self.name,
            effect.client,
            effect.user_id,
            effect.relay[0],
            effect.relay[1],
            f" and [{effect.additional[0]}]:{effect.additional[1]}" if effect.additional else "",
            effect.lifetime_s,
        )
        if self.journal is not None:
            adopt.journal(self, effect.client, created=True)

    def _allocation_refreshed(self, effect: fx.AllocationRefreshed) -> None:
        self.opener.renew_lease(effect.client, effect.lifetime_s)

    def _allocation_aborted(self, effect: fx.AllocationAborted) -> None:
        self.opener.release_lease(effect.client)

    def _allocation_deleted(self, effect: fx.AllocationDeleted) -> None:
        if self.allocations_are_connections:
            self.connections = max(0, self.connections - 1)
        self.opener.release_lease(effect.client)
        if self.journal is not None:
            adopt.forget(self, effect.client)
        log.info(
            "listener %s: allocation for %s (user %s) deleted: %s",
            self.name,
            effect.client,
            effect.user_id,
            effect.reason,
        )

    async def open_relay_endpoint(
        self, client: Address, sock: socket.socket
    ) -> DatagramRelayProtocol:
        """The protocol of a new relay socket, reading it (through an event-loop transport here)."""
        factory = self.relay_class
        _transport, relay = await self.loop.create_datagram_endpoint(
            lambda: factory(self, client, sock), sock=sock
        )
        return relay

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
        if self.inherited_socket is not None:
            self.inherited_socket.close()
            self.inherited_socket = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.opener.tasks.cancel_all()
        for own, dual in self.adopted.values():
            own.close()
            if dual is not None:
                dual.close()
        self.adopted.clear()
        for relay in (*self.relays.values(), *self.dual_relays.values()):
            if relay.transport is not None:
                relay.transport.close()
        self.relays.clear()
        self.dual_relays.clear()
        self.channel_routes.clear()
        for held in self.held_ports.values():
            held.close()
        self.held_ports.clear()
        await self._close_transport()
