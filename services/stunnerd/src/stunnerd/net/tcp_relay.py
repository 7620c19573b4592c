"""The sockets of TURN-TCP relays (RFC 6062) for a TCP or TLS listener.

The engine decides (`stunnerd.turn.tcp_relay`); this module carries it out. A TCP allocation's
relayed address is a listening socket bound like a UDP relay (the listener's bind host, a free
port) with SO_REUSEADDR and SO_REUSEPORT, so that connections to peers can leave from that same
address and port (§5.2). Every peer connection is a `PeerLink`: reading is paused until the
client binds a data connection to it (§5.3: no peer data before ConnectionBind; the kernel
buffers meanwhile), then bytes flow unframed between the two connections. Each side pauses
reading on the other when its write buffer fills, so a slow reader slows the sender instead of
growing memory. Closing either connection closes the other, and the engine is told.

Counters are those of UDP relays: the listener counts reads and writes on the data connection;
the cluster that admits the peer counts the bytes relayed to it (`tx`) and from it (`rx`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping
from typing import Any, Protocol

from stunnerd.net.relay import RX_BYTES, RX_PKTS, TX_BYTES, TX_PKTS, Address, Traffic
from stunnerd.net.tasks import TaskSet
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import TurnEngine
from stunnerd.turn.tcp_connections import CONNECT_TIMEOUT_S

log = logging.getLogger(__name__)


class DataConnection(Protocol):
    """A client's connection that ConnectionBind made a data connection (RFC 6062 §4.4):
    a `stunnerd.net.stream.StreamClientProtocol`."""

    transport: Any  # asyncio.Transport | None; uvloop's is no subclass
    traffic: Traffic
    peer_link: PeerLink | None


class RelayListener(Protocol):
    """What the TCP relays need from their stream listener (`stunnerd.net.stream`)."""

    name: str
    loop: asyncio.AbstractEventLoop
    engine: TurnEngine
    closed: bool

    @property
    def bind_host(self) -> str: ...

    @property
    def clients(self) -> Mapping[Address, DataConnection]: ...

    def apply(self, effects: list[fx.Effect]) -> None: ...

    def cluster_counts(self, peer: Address) -> Traffic: ...


RELAY_BACKLOG = 128


def bind_tcp_relay(bind_host: str, family: int, port: int = 0) -> socket.socket:
    """A non-blocking TCP socket on the relay address, shareable by the allocation's
    outgoing connections (SO_REUSEADDR, SO_REUSEPORT)."""
    af = socket.AF_INET6 if family == 6 else socket.AF_INET
    if (af == socket.AF_INET6) != (":" in bind_host):
        bind_host = "::" if af == socket.AF_INET6 else "0.0.0.0"
    sock = socket.socket(af, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if af == socket.AF_INET6:
            # as for UDP relays: an IPv6 relay reaches and accepts IPv6 peers only, never an
            # IPv4 one through a mapped address the routes judged as IPv6
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setblocking(False)
        sock.bind((bind_host, port))
    except OSError:
        sock.close()
        raise
    return sock


class PeerLink(asyncio.Protocol):
    """One peer connection of a TCP allocation, and the data connection bound to it."""

    def __init__(self, relays: TcpRelays, client: Address) -> None:
        self.relays = relays
        self.client = client  # the allocation (its control connection)
        self.connection_id = 0
        self.transport: asyncio.Transport | None = None
        self.data: DataConnection | None = None
        self.counts: Traffic = [0, 0, 0, 0]
        self.peer: Address = ("", 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        name = transport.get_extra_info("peername")
        self.peer = (name[0], name[1])
        with contextlib.suppress(OSError, AttributeError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.pause_reading()  # type: ignore[attr-defined]  # until a data connection is bound (RFC 6062 §5.3)
        self.relays.peer_made(self)

    def data_received(self, data: bytes) -> None:
        client = self.data
        if client is None or client.transport is None:
            return
        n = len(data)
        counts = self.counts
        counts[RX_PKTS] += 1
        counts[RX_BYTES] += n
        traffic = client.traffic
        traffic[TX_PKTS] += 1
        traffic[TX_BYTES] += n
        client.transport.write(data)

    def to_peer(self, data: bytes) -> None:
        """Bytes from the data connection."""
        if self.transport is not None:
            counts = self.counts
            counts[TX_PKTS] += 1
            counts[TX_BYTES] += len(data)
            self.transport.write(data)

    def pause_writing(self) -> None:
        if self.data is not None and self.data.transport is not None:
            self.data.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.data is not None and self.data.transport is not None:
            self.data.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.data is not None and self.data.transport is not None:
            self.data.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.data is not None and self.data.transport is not None:
            self.data.transport.close()
        self.relays.peer_lost(self)


class TcpRelays:
    """The TCP relays, peer connections and pending connects of one stream listener."""

    def __init__(self, listener: RelayListener) -> None:
        self.listener = listener
        self.loop = listener.loop
        self.servers: dict[Address, asyncio.Server] = {}  # by allocation
        self.links: dict[int, PeerLink] = {}  # by connection id
        self.connecting: dict[int, asyncio.Task[None]] = {}
        self.tasks = TaskSet(self.loop)

    # ---------------------------------------------------------- relayed addresses

    def open(self, effect: fx.OpenRelay) -> None:
        listener = self.listener
        try:
            sock = bind_tcp_relay(listener.bind_host, effect.family)
            sock.listen(RELAY_BACKLOG)
        except OSError as exc:
            log.warning("listener %s: cannot open a TCP relay: %s", listener.name, exc)
            listener.apply(listener.engine.relay_failed(effect.client, self.loop.time()))
            return
        self.tasks.spawn(self._serve(effect.client, sock), f"tcp-relay-open:{listener.name}")

    async def _serve(self, client: Address, sock: socket.socket) -> None:
        listener = self.listener
        try:
            server = await self.loop.create_server(lambda: PeerLink(self, client), sock=sock)
        except OSError as exc:
            sock.close()
            log.warning("listener %s: TCP relay failed: %s", listener.name, exc)
            listener.apply(listener.engine.relay_failed(client, self.loop.time()))
            return
        if listener.closed:
            server.close()
            return
        self.servers[client] = server
        port = int(sock.getsockname()[1])
        listener.apply(listener.engine.relay_opened(client, port, self.loop.time()))

    def close_relay(self, client: Address) -> None:
        server = self.servers.pop(client, None)
        if server is not None:
            server.close()

    # ---------------------------------------------------------- peer connections

    def peer_made(self, link: PeerLink) -> None:
        """A connection reached a relayed address, or a Connect's connection is up."""
        if link.connection_id:
            return  # an outgoing connection: `_connect` registers it
        listener = self.listener
        connection_id, effects = listener.engine.peer_arrived(
            link.client, link.peer, self.loop.time()
        )
        if not connection_id:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("listener %s: refused peer connection from %s", listener.name, link.peer)
            assert link.transport is not None
            link.transport.abort()
            return
        self._register(link, connection_id)
        listener.apply(effects)

    def _register(self, link: PeerLink, connection_id: int) -> None:
        link.connection_id = connection_id
        link.counts = self.listener.cluster_counts(link.peer)
        self.links[connection_id] = link

    def connect(self, effect: fx.ConnectPeer) -> None:
        task = self.tasks.spawn(
            self._connect(effect), f"tcp-relay-connect:{self.listener.name}:{effect.connection_id}"
        )
        self.connecting[effect.connection_id] = task

    async def _connect(self, effect: fx.ConnectPeer) -> None:
        listener = self.listener
        server = self.servers.get(effect.client)
        link = PeerLink(self, effect.client)
        link.connection_id = effect.connection_id  # set before connection_made
        try:
            if server is None:
                raise OSError("the allocation's relay is gone")
            relay_port = int(server.sockets[0].getsockname()[1])
            family = 6 if ":" in effect.peer[0] else 4
            sock = bind_tcp_relay(listener.bind_host, family, relay_port)
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await self.loop.sock_connect(sock, effect.peer)
                await self.loop.connect_accepted_socket(lambda: link, sock)
            except BaseException:
                sock.close()
                raise
        except (OSError, TimeoutError) as exc:
            self.connecting.pop(effect.connection_id, None)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("listener %s: connect to %s failed: %s", listener.name, effect.peer, exc)
            listener.apply(
                listener.engine.peer_connect_failed(effect.connection_id, self.loop.time())
            )
            return
        self.connecting.pop(effect.connection_id, None)
        self._register(link, effect.connection_id)
        listener.apply(listener.engine.peer_connected(effect.connection_id, self.loop.time()))

    def bind(self, effect: fx.BindPeerConnection) -> None:
        """Splice the data connection that sent ConnectionBind to the peer connection."""
        listener = self.listener
        link = self.links.get(effect.connection_id)
        data = listener.clients.get(effect.data_client)
        if link is None or link.transport is None or data is None or data.transport is None:
            if data is not None and data.transport is not None:
                data.transport.close()
            self.close_link(effect.connection_id)
            return
        link.data = data
        data.peer_link = link
        link.transport.resume_reading()

    def recount(self) -> None:
        """After a policy change a peer may fall under another cluster's counters."""
        for link in self.links.values():
            link.counts = self.listener.cluster_counts(link.peer)

    def close_link(self, connection_id: int) -> None:
        task = self.connecting.pop(connection_id, None)
        if task is not None:
            task.cancel()
        link = self.links.pop(connection_id, None)
        if link is not None:
            link.close()

    def peer_lost(self, link: PeerLink) -> None:
        if link.connection_id and self.links.get(link.connection_id) is link:
            del self.links[link.connection_id]
            listener = self.listener
            if not listener.closed:
                listener.apply(
                    listener.engine.peer_connection_closed(link.connection_id, self.loop.time())
                )

    # ---------------------------------------------------------- lifetime

    async def close(self) -> None:
        await self.tasks.cancel_all()
        for link in list(self.links.values()):
            link.close()
        self.links.clear()
        for server in self.servers.values():
            server.close()
        self.servers.clear()
