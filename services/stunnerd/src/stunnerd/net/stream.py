"""TURN-TCP and TURN-TLS listeners: one asyncio stream connection per client.

On a stream, STUN messages and ChannelData frames follow each other with no separator; a frame's
length is in its header and ChannelData is padded to a multiple of 4 bytes (RFC 8656 §12.5). Each
connection is its own client transport address; when it closes, its allocation goes too. TLS is
asyncio's ssl with the listener's certificate, on connections `stunnerd.net.tls` accepts.
Writes to a client whose socket buffer is full are dropped rather than queued without bound.

A client that has not allocated yet is held to `stunnerd.net.guard.ConnectionLimits`: a cap on
connections per source IP (TLS: counted at TCP accept, before the handshake, which has its own
deadline; the listener accepts TLS connections itself for that), a deadline for its first
complete message, a minimum average rate
(a trickle is closed), and STUN frames no longer than the engine's message limit (a longer one
closes the connection before it is buffered).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import Any

from stunner_common.config import TlsPair
from stunnerd.net.admission import preauth_refusal
from stunnerd.net.binding import ACCEPT_BACKLOG, DUAL_STACK_HOSTS, bind_tcp_server
from stunnerd.net.guard import SourceCounter
from stunnerd.net.listener import Address, Listener, SendTo
from stunnerd.net.relay import StreamRelayProtocol
from stunnerd.net.tcp_relay import PeerLink, TcpRelays
from stunnerd.net.tls import AdmittedProtocol, TlsAcceptor, load_pair, server_ssl_context
from stunnerd.turn import effects as fx
from stunnerd.turn.codec import stream_frame_length

log = logging.getLogger(__name__)

MAX_BUFFERED_BYTES = 256 * 1024


class StreamClientProtocol(AdmittedProtocol):
    """One TCP/TLS client connection: de-frames the stream, fast-paths routed ChannelData."""

    def __init__(self, listener: StreamListener, admitted: bool = False) -> None:
        """`admitted`: the listener counted it at accept already (TLS, before the handshake)."""
        self.listener = listener
        self.admitted = admitted
        self.routes = listener.routes
        self.traffic = listener.traffic
        self.transport: asyncio.Transport | None = None
        self.client: Address = ("", 0)
        self.buf = bytearray()
        self.max_message_bytes = listener.limits.request.max_message_bytes
        self.paused = False
        self.active = True  # saw data since the last idle check
        self.idle_handle: asyncio.TimerHandle | None = None
        self.counted = False  # holds one of its source's connection slots
        self.frames = 0  # complete frames received
        self.window_bytes = 0  # bytes received since the last pre-authentication check
        self.guard_handle: asyncio.TimerHandle | None = None
        # RFC 6062 §5.4: after ConnectionBind this is a data connection carrying raw bytes
        self.peer_link: PeerLink | None = None

    def _idle_check(self) -> None:
        """Close a connection that sent nothing for a while and holds no allocation."""
        self.idle_handle = None
        if self.transport is None:
            return
        if self.peer_link is not None:
            return  # a data connection: its peer connection and allocation govern it
        if not self.active and self.client not in self.listener.engine.allocations:
            log.info("listener %s: closing idle connection %s", self.listener.name, self.client)
            self.listener.engine.refusals.limited("idle_timeout")
            self.transport.close()
            return
        self.active = False
        self.idle_handle = self.listener.loop.call_later(
            self.listener.tuning.client_idle_timeout_s, self._idle_check
        )

    def _guard_check(self) -> None:
        """Before an allocation: a first message in time, then a minimum average rate."""
        self.guard_handle = None
        if (
            self.transport is None
            or self.peer_link is not None
            or self.client in self.listener.engine.allocations
        ):
            return
        limits = self.listener.limits.connection
        refusal = preauth_refusal(limits, self.frames, self.window_bytes, "complete message")
        if refusal is None:
            self.window_bytes = 0
            self.guard_handle = self.listener.loop.call_later(
                limits.preauth_window_s, self._guard_check
            )
            return
        limit, reason = refusal
        self.listener.engine.refusals.limited(limit)
        log.info("listener %s: closing %s: %s", self.listener.name, self.client, reason)
        self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = (peer[0], peer[1])
        if not self.admitted and not self.listener.admit(self.client[0]):
            transport.abort()  # type: ignore[attr-defined]
            return
        self.counted = True
        self.guard_handle = self.listener.loop.call_later(
            self.listener.limits.connection.first_message_timeout_s, self._guard_check
        )
        with contextlib.suppress(OSError, AttributeError):
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.listener.connection_opened(self.client, self)
        self.active = False
        self.idle_handle = self.listener.loop.call_later(
            self.listener.tuning.client_idle_timeout_s, self._idle_check
        )

    def data_received(self, data: bytes) -> None:
        self.active = True
        counts = self.traffic
        counts[0] += 1  # upstream counts reads on streams, not frames
        counts[1] += len(data)
        if self.peer_link is not None:
            self.peer_link.to_peer(data)
            return
        self.window_bytes += len(data)
        buf = self.buf
        buf += data
        offset = 0
        end = len(buf)
        routes = self.routes
        client = self.client
        send = self.listener.batcher.send
        while True:
            size = stream_frame_length(buf, offset)
            if size > self.max_message_bytes and buf[offset] < 0x40:
                log.info("listener %s: %s sent an oversized message", self.listener.name, client)
                self.listener.engine.refusals.limited("message_bytes")
                assert self.transport is not None
                self.transport.close()
                buf.clear()
                return
            if size == 0 or end - offset < size:
                break
            if size < 0:
                log.info("listener %s: %s sent a bad frame, closing", self.listener.name, client)
                assert self.transport is not None
                self.transport.close()
                buf.clear()
                return
            first = buf[offset]
            self.frames += 1
            if 0x40 <= first <= 0x7F:
                route = routes.get((client, (first << 8) | buf[offset + 1]))
                if route is not None:
                    n = (buf[offset + 2] << 8) | buf[offset + 3]
                    counts = route[2]
                    counts[2] += 1
                    counts[3] += n
                    send(route[0], bytes(buf[offset + 4 : offset + 4 + n]), route[1])
                    offset += size
                    continue
            self.listener.client_slow_path(bytes(buf[offset : offset + size]), client)
            offset += size
            if self.peer_link is not None:  # that was a ConnectionBind: the rest is raw
                rest = bytes(buf[offset:])
                buf.clear()
                if rest:
                    self.peer_link.to_peer(rest)
                return
        if offset:
            del buf[:offset]
        if len(buf) > MAX_BUFFERED_BYTES:
            assert self.transport is not None
            self.transport.close()
            buf.clear()

    def send(self, data: bytes, _client: Any = None) -> None:
        if not self.paused and self.transport is not None:
            counts = self.traffic
            counts[2] += 1
            counts[3] += len(data)
            self.transport.write(data)

    def pause_writing(self) -> None:
        self.paused = True
        link = self.peer_link
        if link is not None and link.transport is not None:
            link.transport.pause_reading()  # back-pressure on the peer

    def resume_writing(self) -> None:
        self.paused = False
        link = self.peer_link
        if link is not None and link.transport is not None:
            link.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for handle in (self.idle_handle, self.guard_handle):
            if handle is not None:
                handle.cancel()
        self.idle_handle = self.guard_handle = None
        if self.peer_link is not None:
            self.peer_link.close()
        if self.counted:
            self.counted = False
            self.listener.sources.release(self.client[0])
            self.listener.connection_closed(self.client)


class StreamListener(Listener):
    """TURN-TCP, or TURN-TLS when the spec carries a certificate."""

    stream = True
    relay_class = StreamRelayProtocol

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server: asyncio.Server | None = None
        self.clients: dict[Address, StreamClientProtocol] = {}
        self.ssl_context: ssl.SSLContext | None = None
        self.sources = SourceCounter(self.limits.connection.max_per_source)
        self.refused_connections = 0  # over the per-source cap
        self.tcp_relays = TcpRelays(self)  # RFC 6062 relays of this listener's allocations
        self.tls: TlsAcceptor | None = None  # TURN-TLS: we accept connections ourselves
        if self.spec.protocol == "TURN-TLS":
            if self.spec.tls is None:
                raise ValueError(f"listener {self.name}: TURN-TLS needs a certificate")
            self.ssl_context = server_ssl_context(self.spec.tls)
            self.tls = TlsAcceptor(
                self.name,
                self.loop,
                self.ssl_context,
                self.limits.connection,
                self,
                new_client=lambda: StreamClientProtocol(self, admitted=True),
                timed_out=lambda: self.engine.refusals.limited("handshake_timeout"),
            )

    async def start(self) -> None:
        sock, self.inherited_socket = self.inherited_socket, None
        if sock is None and (self.tls is not None or self.spec.bind_host in DUAL_STACK_HOSTS):
            sock = bind_tcp_server(self.spec.bind_host, self.spec.port, self.spec.reuse_port)
        if self.tls is not None:
            assert sock is not None
            self.tls.start(sock)
            return
        if sock is not None:
            try:
                self.server = await self.loop.create_server(
                    lambda: StreamClientProtocol(self), sock=sock
                )
            except BaseException:
                sock.close()
                raise
            return
        self.server = await self.loop.create_server(
            lambda: StreamClientProtocol(self),
            host=self.spec.bind_host,
            port=self.spec.port,
            reuse_address=True,
            backlog=ACCEPT_BACKLOG,
            reuse_port=self.spec.reuse_port or None,
        )

    def admit(self, ip: str) -> bool:
        """Take one of `ip`'s connection slots, or count the connection as refused."""
        if self.sources.acquire(ip):
            return True
        self.refused_connections += 1
        self.engine.refusals.limited("connections_per_source")
        if log.isEnabledFor(logging.DEBUG):
            log.debug("listener %s: too many connections from %s", self.name, ip)
        return False

    def release(self, ip: str) -> None:
        """Give back a connection slot of `ip` (a TLS handshake that failed)."""
        self.sources.release(ip)

    def rotate_certificate(self, pair: TlsPair) -> bool:
        """New connections get the new certificate; established ones keep theirs."""
        if self.ssl_context is None:
            return False
        server_ssl_context(pair)  # fail before touching the live context
        load_pair(self.ssl_context, pair)  # the server holds this very context object
        return True

    @property
    def bound_port(self) -> int:
        if self.tls is not None and self.tls.sock is not None:
            return self.tls.port
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def recount_tcp_relays(self) -> None:
        self.tcp_relays.recount()

    def tcp_relay_effect(self, effect: fx.TcpRelayEffect) -> None:
        relays = self.tcp_relays
        match effect:
            case fx.OpenRelay():
                relays.open(effect)
            case fx.CloseRelay():
                relays.close_relay(effect.client)
            case fx.ConnectPeer():
                relays.connect(effect)
            case fx.BindPeerConnection():
                relays.bind(effect)
            case fx.ClosePeerConnection():
                relays.close_link(effect.connection_id)

    def connection_opened(self, client: Address, proto: StreamClientProtocol) -> None:
        self.clients[client] = proto
        self.connections += 1
        self.connections_total += 1

    def connection_closed(self, client: Address) -> None:
        if self.clients.pop(client, None) is not None:
            self.connections -= 1
        self.client_closed(client)

    def client_sender(self, client: Address) -> SendTo:
        proto = self.clients.get(client)
        if proto is None:
            return lambda data, addr: None
        return proto.send

    def send_to_client(self, client: Address, data: bytes) -> None:
        proto = self.clients.get(client)
        if proto is not None:
            proto.send(data)

    async def _close_transport(self) -> None:
        await self.tcp_relays.close()
        if self.server is not None:
            self.server.close()
        if self.tls is not None:
            await self.tls.close()
        for proto in list(self.clients.values()):
            if proto.transport is not None:
                proto.transport.abort()
        self.clients.clear()
        if self.server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tuning.stream_close_timeout_s):
                    await self.server.wait_closed()
            self.server = None
