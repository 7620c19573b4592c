"""The OpenSSL half of TURN-DTLS (`stunnerd.net.dtls`): the server context, the stateless
cookie exchange and one client's session over memory BIOs.

It is imported only once a TURN-DTLS listener is configured, so that a process without one never
loads pyOpenSSL and cryptography.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL

from stunner_common.config import TlsPair
from stunnerd.net.listener import Address, SendTo

DTLS_MTU_BYTES = 1400


class SessionOwner(Protocol):
    """What a session needs of its listener (`stunnerd.net.dtls.DtlsListener`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def sendto(self) -> SendTo | None: ...
    def session_established(self, session: DtlsSession) -> None: ...
    def drop_session(self, session: DtlsSession, reason: str) -> None: ...
    def client_record(self, record: bytes, client: Address) -> None: ...


def _cookie(secret: bytes, addr: Any) -> bytes:
    return hmac.new(secret, repr(addr).encode(), hashlib.sha256).digest()[:16]


def dtls_context(pair: TlsPair) -> SSL.Context:
    """Server context; a HelloVerifyRequest cookie (RFC 6347 §4.2.1) bound to the client address
    must come back before any state is kept or the certificate flight is sent."""
    ctx = SSL.Context(SSL.DTLS_METHOD)
    secret = os.urandom(32)
    ctx.set_cookie_generate_callback(lambda conn: _cookie(secret, conn.get_app_data()))
    ctx.set_cookie_verify_callback(
        lambda conn, cookie: hmac.compare_digest(cookie, _cookie(secret, conn.get_app_data()))
    )
    chain = x509.load_pem_x509_certificates(pair.cert_pem)
    ctx.use_certificate(chain[0])
    for extra in chain[1:]:
        ctx.add_extra_chain_cert(extra)
    key = serialization.load_pem_private_key(pair.key_pem, password=None)
    ctx.use_privatekey(key)  # type: ignore[arg-type]
    ctx.check_privatekey()
    ctx.set_options(SSL.OP_NO_QUERY_MTU)
    return ctx


class DtlsSession:
    """One client's DTLS association over the shared listener socket."""

    __slots__ = (
        "addr",
        "client",
        "conn",
        "established",
        "guard_handle",
        "idle_handle",
        "last_seen",
        "listener",
        "records",
        "timer",
        "window_bytes",
    )

    def __init__(self, listener: SessionOwner, addr: Any, conn: SSL.Connection) -> None:
        self.listener = listener
        self.addr = addr
        self.client: Address = (addr[0], addr[1])
        self.conn = conn  # past DTLSv1_listen: the client proved it owns its address
        self.established = False
        self.timer: asyncio.TimerHandle | None = None
        self.idle_handle: asyncio.TimerHandle | None = None
        self.guard_handle: asyncio.TimerHandle | None = None
        self.last_seen = listener.loop.time()
        self.records = 0
        self.window_bytes = 0

    def feed(self, data: bytes) -> None:
        self.last_seen = self.listener.loop.time()
        self.window_bytes += len(data)
        conn = self.conn
        try:
            if data:
                conn.bio_write(data)
            if not self.established:
                try:
                    conn.do_handshake()
                except SSL.WantReadError:
                    self.flush()
                    self._arm_timer()
                    return
                self.established = True
                self._cancel_timer()
                self.listener.session_established(self)
            while True:
                try:
                    record = conn.recv(65536)
                except SSL.WantReadError:
                    break
                self.records += 1
                self.listener.client_record(record, self.client)
        except SSL.ZeroReturnError:
            self.listener.drop_session(self, "closed by the client")
            return
        except SSL.Error as exc:
            self.flush()  # send the alert, if any
            self.listener.drop_session(self, f"DTLS error: {exc}")
            return
        self.flush()

    def send(self, data: bytes, _addr: Any = None) -> None:
        try:
            self.conn.send(data)
        except SSL.Error:
            return
        self.flush()

    def flush(self) -> None:
        sendto = self.listener.sendto
        if sendto is None:
            return
        while True:
            try:
                out = self.conn.bio_read(65536)
            except SSL.WantReadError:
                return
            sendto(out, self.addr)

    def _arm_timer(self) -> None:
        self._cancel_timer()
        timeout = self.conn.DTLSv1_get_timeout()
        if timeout is not None:
            self.timer = self.listener.loop.call_later(timeout, self._on_timer)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_timer(self) -> None:
        self.timer = None
        try:
            self.conn.DTLSv1_handle_timeout()
        except SSL.Error:
            self.listener.drop_session(self, "handshake failed")
            return
        self.flush()
        if not self.established:
            self._arm_timer()

    def close(self, notify: bool) -> None:
        self._cancel_timer()
        for handle in (self.idle_handle, self.guard_handle):
            if handle is not None:
                handle.cancel()
        self.idle_handle = self.guard_handle = None
        if notify:
            with contextlib.suppress(SSL.Error):
                self.conn.shutdown()
            self.flush()


def listen(context: SSL.Context, data: bytes, addr: Any, sendto: SendTo) -> SSL.Connection | None:
    """A ClientHello from an unknown address: the connection once the hello carried a valid
    cookie; otherwise answer with a HelloVerifyRequest (or nothing) and keep no state (None)."""
    conn = SSL.Connection(context, None)
    conn.set_app_data((addr[0], addr[1]))
    conn.set_accept_state()
    conn.set_ciphertext_mtu(DTLS_MTU_BYTES)
    try:
        conn.bio_write(data)
        conn.DTLSv1_listen()
    except SSL.WantReadError:
        while True:  # the HelloVerifyRequest
            try:
                sendto(conn.bio_read(65536), addr)
            except SSL.WantReadError:
                return None
    except SSL.Error:
        return None
    return conn
