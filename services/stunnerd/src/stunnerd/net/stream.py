"""TURN-TCP and TURN-TLS listeners: one asyncio stream connection per client.

On a stream, STUN messages and ChannelData frames follow each other with no separator; a frame's
length is in its header and ChannelData is padded to a multiple of 4 bytes (RFC 8656 §12.5). Each
connection is its own client transport address; when it closes, its allocation goes too. TLS is
asyncio's ssl with the listener's certificate (TLS ≥ 1.2, handshake bounded by a timeout).
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
import os
import socket
import ssl
import tempfile
from typing import Any

from stunner_common.config import TlsPair
from stunnerd.net.binding import DUAL_STACK_HOSTS, allow_both_families
from stunnerd.net.guard import SourceCounter
from stunnerd.net.listener import Address, Listener, SendTo
from stunnerd.net.relay import StreamRelayProtocol
from stunnerd.net.tcp_relay import PeerLink, TcpRelays
from stunnerd.turn import effects as fx
from stunnerd.turn.codec import stream_frame_length

log = logging.getLogger(__name__)

ACCEPT_BACKLOG = 4096  # bursts of connections wait in the kernel, not in SYN retries


def bind_dual_stack_server(port: int, reuse_port: bool) -> socket.socket:
    """A listening TCP socket on `[::]:port` that takes IPv4 clients too."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        allow_both_families(sock, "::")
        sock.bind(("::", port))
        sock.listen(ACCEPT_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


MAX_BUFFERED_BYTES = 256 * 1024


def load_pair(ctx: ssl.SSLContext, pair: TlsPair) -> None:
    """Load in-memory PEM into `ctx` (ssl only loads files, so go through a private temp dir)."""
    with tempfile.TemporaryDirectory(prefix="stunnerd-tls-") as tmp:
        cert_path = os.path.join(tmp, "cert.pem")
        key_path = os.path.join(tmp, "key.pem")
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pair.key_pem)
        with open(cert_path, "wb") as fh:
            fh.write(pair.cert_pem)
        ctx.load_cert_chain(cert_path, key_path)


def server_ssl_context(pair: TlsPair) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_pair(ctx, pair)
    return ctx


class StreamClientProtocol(asyncio.Protocol):
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
        if self.frames == 0:
            reason = f"no complete message within {limits.first_message_timeout_s:g} s"
        elif self.window_bytes < limits.preauth_min_bytes_per_s * limits.preauth_window_s:
            reason = f"slower than {limits.preauth_min_bytes_per_s:g} B/s before allocating"
        else:
            self.window_bytes = 0
            self.guard_handle = self.listener.loop.call_later(
                limits.preauth_window_s, self._guard_check
            )
            return
        log.info("listener %s: closing %s: %s", self.listener.name, self.client, reason)
        self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = (peer[0], peer[1])
        if not self.admitted and not self.listener.sources.acquire(self.client[0]):
            self.listener.refused_connections += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("listener %s: too many connections from %s", self.listener.name, peer[0])
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
        self.tls_socket: socket.socket | None = None  # TLS: the listening socket we accept on
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()  # TLS handshakes under way
        self.tcp_relays = TcpRelays(self)  # RFC 6062 relays of this listener's allocations
        if self.spec.protocol == "TURN-TLS":
            if self.spec.tls is None:
                raise ValueError(f"listener {self.name}: TURN-TLS needs a certificate")
            self.ssl_context = server_ssl_context(self.spec.tls)

    async def start(self) -> None:
        inherited, self.inherited_socket = self.inherited_socket, None
        if inherited is None and self.spec.bind_host in DUAL_STACK_HOSTS:
            # asyncio would make a `::` server socket IPv6-only; bind it ourselves for both
            inherited = bind_dual_stack_server(self.spec.port, self.spec.reuse_port)
        if self.ssl_context is not None:
            self._start_tls(inherited)
            return
        if inherited is not None:
            try:
                self.server = await self.loop.create_server(
                    lambda: StreamClientProtocol(self), sock=inherited
                )
            except BaseException:
                inherited.close()
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

    # -------------------------------------------------------------- TURN-TLS

    def _start_tls(self, inherited: socket.socket | None) -> None:
        """Accept TLS connections ourselves, so that the per-source cap counts a connection at
        TCP accept, before its handshake costs anything (an asyncio server with `ssl` would
        show it to us only after the handshake)."""
        sock = inherited if inherited is not None else self._bind_tls_socket()
        sock.setblocking(False)
        self.tls_socket = sock
        self._accepting = self.loop.create_task(
            self._accept_tls(sock), name=f"stunnerd-tls-accept-{self.name}"
        )
        self._accepting.add_done_callback(_log_unexpected_exit)

    def _bind_tls_socket(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.spec.bind_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.spec.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.spec.bind_host, self.spec.port))
            sock.listen(ACCEPT_BACKLOG)
        except BaseException:
            sock.close()
            raise
        return sock

    async def _accept_tls(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, peer = await self.loop.sock_accept(sock)
            except OSError as exc:  # EMFILE, ECONNABORTED...: the next accept may succeed
                log.warning("listener %s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            if not self.sources.acquire(peer[0]):
                self.refused_connections += 1
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("listener %s: too many connections from %s", self.name, peer[0])
                conn.close()
                continue
            task = self.loop.create_task(
                self._handshake(conn, peer[0]), name=f"stunnerd-tls-handshake-{self.name}"
            )
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, ip: str) -> None:
        """The TLS handshake of an admitted connection, within `handshake_timeout_s`; its source
        slot goes back if it fails (afterwards the connection's own close returns it)."""
        assert self.ssl_context is not None
        proto = StreamClientProtocol(self, admitted=True)
        try:
            await self.loop.connect_accepted_socket(
                lambda: proto,
                conn,
                ssl=self.ssl_context,
                ssl_handshake_timeout=self.limits.connection.handshake_timeout_s,
            )
        except BaseException as exc:
            if not proto.counted:  # connection_made never ran: the slot is still ours
                self.sources.release(ip)
            conn.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            if log.isEnabledFor(logging.DEBUG):
                log.debug("listener %s: TLS handshake with %s failed: %r", self.name, ip, exc)

    def rotate_certificate(self, pair: TlsPair) -> bool:
        """New connections get the new certificate; established ones keep theirs."""
        if self.ssl_context is None:
            return False
        server_ssl_context(pair)  # fail before touching the live context
        load_pair(self.ssl_context, pair)  # the server holds this very context object
        return True

    @property
    def bound_port(self) -> int:
        if self.tls_socket is not None:
            return int(self.tls_socket.getsockname()[1])
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
        pending = [t for t in (self._accepting, *self._handshakes) if t is not None]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        self._accepting = None
        if self.tls_socket is not None:
            self.tls_socket.close()
            self.tls_socket = None
        for proto in list(self.clients.values()):
            if proto.transport is not None:
                proto.transport.abort()
        self.clients.clear()
        if self.server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tuning.stream_close_timeout_s):
                    await self.server.wait_closed()
            self.server = None


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r", task.get_name(), task.exception())
