"""TURN-TLS: the server certificate, and accepting connections before their handshake.

A TLS listener accepts its TCP connections itself instead of handing `ssl` to an asyncio server,
which would show a connection only once its handshake is done: counting a connection against
its source's cap at TCP accept means a flood of half-open handshakes costs nothing beyond the
cap (`stunnerd.net.guard.ConnectionLimits`), and each handshake has its own deadline. TLS ≥ 1.2;
a rotated certificate is loaded into the live context, so new connections get it and
established ones keep theirs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable
from typing import Protocol

from stunner_common.config import TlsPair
from stunnerd.net.guard import ConnectionLimits
from stunnerd.net.tasks import TaskSet, log_unexpected_exit

log = logging.getLogger(__name__)

ACCEPT_RETRY_S = 0.1


def load_pair(ctx: ssl.SSLContext, pair: TlsPair) -> None:
    """Load in-memory PEM into `ctx` (ssl only loads files, so go through a private temp dir)."""
    import tempfile  # (with shutil, bz2 and lzma) only for a TLS or DTLS listener

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


class AdmittedProtocol(asyncio.Protocol):
    """A client connection whose source slot was taken before its handshake."""

    counted = False
    """True from `connection_made` on: from then, closing the connection returns the slot."""


class Admission(Protocol):
    """Who counts a TLS listener's connections by source IP (its `SourceCounter`)."""

    def admit(self, ip: str) -> bool:
        """Take one of `ip`'s slots, or refuse (and count the refusal)."""

    def release(self, ip: str) -> None:
        """Give a slot back."""


class TlsAcceptor:
    """The accept loop of one TLS listener and the handshakes under way.

    `limits` is the listener's `ConnectionLimits` (the handshake deadline); `sources` admits and
    releases connections by source IP; `new_client` builds the protocol of an admitted
    connection and `timed_out` is told of each handshake that ran out of time.
    """

    def __init__(
        self,
        name: str,
        loop: asyncio.AbstractEventLoop,
        context: ssl.SSLContext,
        limits: ConnectionLimits,
        sources: Admission,
        new_client: Callable[[], AdmittedProtocol],
        timed_out: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.loop = loop
        self.context = context
        self.limits = limits
        self.handshake_timeout_s = limits.handshake_timeout_s
        self.admit = sources.admit  # takes a slot of the source IP, or refuses
        self.release = sources.release
        self.new_client = new_client
        self.timed_out = timed_out  # a handshake ran out of `handshake_timeout_s`
        self.sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self.handshakes = TaskSet(loop)

    def start(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._accepting = self.loop.create_task(
            self._accept(sock), name=f"stunnerd-tls-accept-{self.name}"
        )
        self._accepting.add_done_callback(log_unexpected_exit)

    @property
    def port(self) -> int:
        assert self.sock is not None
        return int(self.sock.getsockname()[1])

    async def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, peer = await self.loop.sock_accept(sock)
            except OSError as exc:  # EMFILE, ECONNABORTED...: the next accept may succeed
                log.warning("listener %s: accept failed: %s", self.name, exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            if not self.admit(peer[0]):
                conn.close()
                continue
            self.handshakes.spawn(
                self._handshake(conn, peer[0]), f"stunnerd-tls-handshake-{self.name}"
            )

    async def _handshake(self, conn: socket.socket, ip: str) -> None:
        """The TLS handshake of an admitted connection, within `handshake_timeout_s`; its source
        slot goes back if it fails (afterwards the connection's own close returns it)."""
        proto = self.new_client()
        started = self.loop.time()
        try:
            await self.loop.connect_accepted_socket(
                lambda: proto,
                conn,
                ssl=self.context,
                ssl_handshake_timeout=self.handshake_timeout_s,
            )
        except BaseException as exc:
            if not proto.counted:  # connection_made never ran: the slot is still ours
                self.release(ip)
            conn.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            # asyncio aborts a handshake past its deadline with ConnectionAbortedError
            late = self.loop.time() - started >= self.handshake_timeout_s
            if isinstance(exc, ConnectionAbortedError) and late:
                self.timed_out()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("listener %s: TLS handshake with %s failed: %r", self.name, ip, exc)

    async def close(self) -> None:
        """Stop accepting, cancel the handshakes under way and close the listening socket."""
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
            self._accepting = None
        await self.handshakes.cancel_all()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
