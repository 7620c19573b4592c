"""TURN-DTLS: TURN over DTLS on one UDP socket, with pyOpenSSL and memory BIOs (as aiortc does).

Each client transport address gets its own `SSL.Connection` in accept state. Datagrams from the
client are written into its BIO; decrypted records (one STUN message or ChannelData frame each)
go to the same fast path / engine as TURN-UDP; anything the connection wants to send is read back
from the BIO and sent as a datagram. Handshake retransmissions follow OpenSSL's DTLS timer
(`DTLSv1_get_timeout`). A close_notify, a fatal alert or a long idle period without an allocation
ends the session, and with it the allocation (RFC 8656 §3.1).

Sessions without an allocation are held to `stunnerd.net.guard.ConnectionLimits`: at most
`max_per_source` per source IP (counted once the client returned the cookie, before any
handshake work), a handshake within `handshake_timeout_s`, a first record within
`first_message_timeout_s` after it, then a minimum average rate until the client allocates.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from stunner_common.config import TlsPair
from stunnerd.net.admission import preauth_refusal
from stunnerd.net.guard import SourceCounter
from stunnerd.net.listener import Address, Listener, SendTo
from stunnerd.net.udp import ClosingDatagramProtocol, close_endpoint, open_listener_socket

if TYPE_CHECKING:
    from OpenSSL import SSL

    from stunnerd.net.dtls_session import DtlsSession

log = logging.getLogger(__name__)

MAX_SESSIONS = 10_000
_RECORD_HANDSHAKE = 22


def dtls_context(pair: TlsPair) -> SSL.Context:
    """The server context of a TURN-DTLS listener (`stunnerd.net.dtls_session.dtls_context`).

    pyOpenSSL and cryptography are imported only once a DTLS listener is configured."""
    from stunnerd.net.dtls_session import dtls_context as build

    return build(pair)


class DtlsListenerProtocol(ClosingDatagramProtocol):
    def __init__(self, listener: DtlsListener) -> None:
        super().__init__()
        self.listener = listener

    def datagram_received(self, data: bytes, addr: Any) -> None:
        counts = self.listener.traffic
        counts[0] += 1
        counts[1] += len(data)
        session = self.listener.sessions.get(addr)
        if session is None:
            if data and data[0] == _RECORD_HANDSHAKE:
                self.listener.hello(data, addr)
            return
        session.feed(data)

    def error_received(self, exc: Exception) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("DTLS listener socket error: %s", exc)


class DtlsListener(Listener):
    """TURN-DTLS: relays are UDP; ChannelData is not padded (datagram transport)."""

    stream = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.spec.tls is None:
            raise ValueError(f"listener {self.name}: TURN-DTLS needs a certificate")
        self.context = dtls_context(self.spec.tls)
        self.sessions: dict[Any, DtlsSession] = {}
        self.transport: asyncio.DatagramTransport | None = None
        self.protocol: DtlsListenerProtocol | None = None
        self.sendto: SendTo | None = None
        self.sources = SourceCounter(self.limits.connection.max_per_source)
        self.refused_connections = 0  # over the per-source cap

    async def start(self) -> None:
        inherited, self.inherited_socket = self.inherited_socket, None
        _sock, transport, self.protocol = await open_listener_socket(
            self.loop, self.spec, lambda: DtlsListenerProtocol(self), inherited
        )
        self.transport = transport
        raw_sendto = transport.sendto
        counts = self.traffic

        def sendto(data: bytes, addr: Any) -> None:
            counts[2] += 1
            counts[3] += len(data)
            raw_sendto(data, addr)

        self.sendto = sendto

    def rotate_certificate(self, pair: TlsPair) -> bool:
        """New sessions use the new certificate; established ones keep theirs."""
        self.context = dtls_context(pair)
        return True

    @property
    def bound_port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def hello(self, data: bytes, addr: Any) -> None:
        """A ClientHello from an unknown address: answer with a cookie, keep no state, and start
        a session only when the hello comes back carrying a valid cookie."""
        if self.sendto is None:
            return
        if len(self.sessions) >= MAX_SESSIONS:
            self.engine.refusals.limited("dtls_sessions")
            return
        from stunnerd.net.dtls_session import DtlsSession, listen

        conn = listen(self.context, data, addr, self.sendto)
        if conn is None:
            return
        if not self.sources.acquire(addr[0]):
            self.refused_connections += 1
            self.engine.refusals.limited("connections_per_source")
            return
        session = DtlsSession(self, addr, conn)
        self.sessions[addr] = session
        self._arm_idle(session)
        session.guard_handle = self.loop.call_later(
            self.limits.connection.handshake_timeout_s, self._guard_check, session
        )
        session.feed(b"")

    def session_established(self, session: DtlsSession) -> None:
        self.connections += 1
        self.connections_total += 1
        if session.guard_handle is not None:
            session.guard_handle.cancel()
        session.window_bytes = 0
        session.guard_handle = self.loop.call_later(
            self.limits.connection.first_message_timeout_s, self._guard_check, session
        )

    def _arm_idle(self, session: DtlsSession) -> None:
        session.idle_handle = self.loop.call_later(
            self.tuning.client_idle_timeout_s, self._idle_check, session
        )

    def _idle_check(self, session: DtlsSession) -> None:
        session.idle_handle = None
        if self.sessions.get(session.addr) is not session:
            return
        idle = self.loop.time() - session.last_seen
        if (
            session.client not in self.engine.allocations
            and idle >= self.tuning.client_idle_timeout_s
        ):
            self.engine.refusals.limited("idle_timeout")
            self.drop_session(session, "idle without an allocation")
            return
        self._arm_idle(session)

    def _guard_check(self, session: DtlsSession) -> None:
        """Before an allocation: handshake, then a first record, then a minimum average rate."""
        session.guard_handle = None
        if self.sessions.get(session.addr) is not session:
            return
        if session.client in self.engine.allocations:
            return
        limits = self.limits.connection
        refusal: tuple[str, str] | None
        if not session.established:
            late = f"handshake not finished within {limits.handshake_timeout_s:g} s"
            refusal = ("handshake_timeout", late)
        else:
            refusal = preauth_refusal(limits, session.records, session.window_bytes)
        if refusal is None:
            session.window_bytes = 0
            session.guard_handle = self.loop.call_later(
                limits.preauth_window_s, self._guard_check, session
            )
            return
        self.engine.refusals.limited(refusal[0])
        self.drop_session(session, refusal[1])

    def drop_session(self, session: DtlsSession, reason: str) -> None:
        if self.sessions.get(session.addr) is not session:
            return
        del self.sessions[session.addr]
        self.sources.release(session.addr[0])
        session.close(notify=False)
        if session.established:
            self.connections -= 1
        log.info("listener %s: DTLS session %s ended: %s", self.name, session.client, reason)
        self.client_closed(session.client)

    def client_record(self, record: bytes, client: Address) -> None:
        if len(record) >= 4 and 0x40 <= record[0] <= 0x7F:
            route = self.routes.get((client, (record[0] << 8) | record[1]))
            if route is not None:
                n = (record[2] << 8) | record[3]
                if n <= len(record) - 4:
                    counts = route[2]
                    counts[2] += 1
                    counts[3] += n
                    self.batcher.send(route[0], record[4 : 4 + n], route[1])
                    return
        self.client_slow_path(record, client)

    def client_sender(self, client: Address) -> SendTo:
        session = self._session_for(client)
        if session is None:
            return lambda data, addr: None
        return session.send

    def send_to_client(self, client: Address, data: bytes) -> None:
        session = self._session_for(client)
        if session is not None:
            session.send(data)

    def _session_for(self, client: Address) -> DtlsSession | None:
        session = self.sessions.get(client)
        if session is None:  # IPv6 sockets report 4-tuples
            for candidate in self.sessions.values():
                if candidate.client == client:
                    return candidate
        return session

    async def _close_transport(self) -> None:
        for session in list(self.sessions.values()):
            session.close(notify=True)
        self.sessions.clear()
        self.sources.counts.clear()
        transport, self.transport = self.transport, None
        if transport is not None:
            self.sendto = None
            await close_endpoint(transport, self.protocol, self.tuning.socket_close_timeout_s)
