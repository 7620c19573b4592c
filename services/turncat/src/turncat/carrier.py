"""The connection from turncat to the TURN server, over UDP, TCP, TLS or DTLS.

A session speaks TURN through a `Carrier`: `send(frame)` puts one STUN message or ChannelData
frame on the wire and every frame that arrives is handed to a `FrameSink`. What differs between
transports stays in here: stream framing for TCP and TLS, and DTLS, which asyncio does not offer,
done with pyOpenSSL over memory BIOs. The Python `ssl` module serves TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, cast

from OpenSSL import SSL, crypto

from stunner_common.framing import StreamDeframer, StreamOutOfSyncError
from turncat.errors import BadInputError, UnreachableError
from turncat.uri import Transport

log = logging.getLogger(__name__)

STREAM_WRITE_LIMIT_BYTES = 1 << 20
DTLS_READ_BYTES = 1 << 16
UDP_RCVBUF_BYTES = 1 << 20
DTLS_MTU_BYTES = 1200
DTLS_RECORD_HEADER = struct.Struct("!B2s2s6sH")  # type, version, epoch, sequence, length
DTLS1_2_VERSION = 0xFEFD  # OpenSSL's DTLS1_2_VERSION; pyOpenSSL does not export it


class FrameSink(Protocol):
    def frame_received(self, frame: bytes) -> None: ...

    def carrier_lost(self, exc: Exception | None) -> None: ...


@dataclass(frozen=True, slots=True)
class TlsOptions:
    insecure: bool = False
    sni: str | None = None
    ca_file: str | None = None


class Carrier(Protocol):
    reliable: bool

    def send(self, frame: bytes) -> None: ...

    def close(self) -> None: ...


async def open_carrier(
    transport: Transport,
    server: tuple[str, int],
    sink: FrameSink,
    tls: TlsOptions,
    timeout_s: float,
) -> Carrier:
    """Connect to the TURN server; raise `UnreachableError` when that fails."""
    loop = asyncio.get_running_loop()
    what = f"{transport.upper()} {server[0]}:{server[1]}"
    try:
        async with asyncio.timeout(timeout_s):
            if transport == "udp":
                _, udp = await loop.create_datagram_endpoint(
                    lambda: UdpCarrier(sink), remote_addr=server
                )
                return udp
            if transport in ("tcp", "tls"):
                ctx = tls_context(tls) if transport == "tls" else None
                _, stream = await loop.create_connection(
                    lambda: StreamCarrier(sink),
                    server[0],
                    server[1],
                    ssl=ctx,
                    server_hostname=(tls.sni or server[0]) if ctx else None,
                )
                return stream
            _, dtls = await loop.create_datagram_endpoint(
                lambda: DtlsCarrier(sink, tls, server[0]), remote_addr=server
            )
            try:
                await dtls.handshake()
            except BaseException:
                dtls.close()
                raise
            return dtls
    except TimeoutError:
        raise UnreachableError(
            f"TURN server {what} did not answer within {timeout_s:g} s"
        ) from None
    except ssl.SSLCertVerificationError as exc:
        raise UnreachableError(
            f"TLS to {what} failed: {exc.verify_message or exc} (use --insecure or --ca)"
        ) from None
    except (OSError, SSL.Error) as exc:
        raise UnreachableError(f"cannot connect to TURN server {what}: {exc}") from None


async def open_data_connection(
    transport: Transport, server: tuple[str, int], tls: TlsOptions, timeout_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new TCP (or TLS) connection to the TURN server, for an RFC 6062 data connection
    (§4.3): it carries one ConnectionBind and then the peer's raw bytes."""
    what = f"{transport.upper()} {server[0]}:{server[1]}"
    ctx = tls_context(tls) if transport == "tls" else None
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.open_connection(
                server[0],
                server[1],
                ssl=ctx,
                server_hostname=(tls.sni or server[0]) if ctx else None,
                limit=STREAM_WRITE_LIMIT_BYTES,
            )
    except TimeoutError:
        raise UnreachableError(
            f"TURN server {what} did not accept a data connection within {timeout_s:g} s"
        ) from None
    except OSError as exc:
        raise UnreachableError(f"cannot open a data connection to {what}: {exc}") from None


CarrierOpener = Callable[
    [Transport, tuple[str, int], FrameSink, TlsOptions, float], Awaitable[Carrier]
]


@dataclass(frozen=True, slots=True)
class ServerLink:
    """How a session reaches its TURN server: transport, address, TLS options and the opener
    of its carrier (tests pass a fake one)."""

    transport: Transport
    server: tuple[str, int]
    tls: TlsOptions
    opener: CarrierOpener = open_carrier

    async def open(self, sink: FrameSink, timeout_s: float) -> Carrier:
        return await self.opener(self.transport, self.server, sink, self.tls, timeout_s)

    async def data_connection(
        self, timeout_s: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await open_data_connection(self.transport, self.server, self.tls, timeout_s)


def tls_context(tls: TlsOptions) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif tls.ca_file:
        try:
            ctx.load_verify_locations(cafile=tls.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise BadInputError(f"cannot load CA file {tls.ca_file!r}: {exc}") from None
    return ctx


def enlarge_receive_buffer(transport: asyncio.BaseTransport) -> None:
    """Ask for `UDP_RCVBUF_BYTES` of receive buffer on a UDP socket, so that bursts wait there
    while the loop is busy (best effort: the kernel may cap it)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RCVBUF_BYTES)


class UdpCarrier(asyncio.DatagramProtocol):
    """TURN over a connected UDP socket: one datagram is one frame."""

    reliable = False

    def __init__(self, sink: FrameSink) -> None:
        self._sink = sink
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)
        enlarge_receive_buffer(transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._sink.frame_received(data)

    def error_received(self, exc: Exception) -> None:
        # A connected UDP socket reports ICMP port unreachable here.
        self._sink.carrier_lost(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._sink.carrier_lost(exc)

    def send(self, frame: bytes) -> None:
        if self._transport is not None:
            self._transport.sendto(frame)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class StreamCarrier(asyncio.Protocol):
    """TURN over TCP or TLS: frames are cut from the byte stream (RFC 8656 §12.5)."""

    reliable = True

    def __init__(self, sink: FrameSink) -> None:
        self._sink = sink
        self._deframer = StreamDeframer()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._deframer.feed(data)
        except StreamOutOfSyncError as exc:
            log.warning("closing TURN connection: %s", exc)
            self.close()
            return
        for frame in frames:
            self._sink.frame_received(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._sink.carrier_lost(exc)

    def send(self, frame: bytes) -> None:
        t = self._transport
        if t is None or t.is_closing():
            return
        if t.get_write_buffer_size() > STREAM_WRITE_LIMIT_BYTES:
            return  # relayed media is datagrams: drop rather than queue without bound
        t.write(frame)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class DtlsCarrier(asyncio.DatagramProtocol):
    """TURN over DTLS (RFC 8656 §3.1): pyOpenSSL runs the record layer in memory BIOs.

    Each TURN frame is written as one DTLS record and every datagram read is fed to OpenSSL, which
    hands back zero or more records' plaintext, each one TURN frame. During the handshake the
    retransmission timer OpenSSL asks for (`DTLSv1_get_timeout`) is honoured.
    """

    reliable = False

    def __init__(self, sink: FrameSink, tls: TlsOptions, host: str) -> None:
        self._sink = sink
        self._tls = tls
        self._host = tls.sni or host
        self._transport: asyncio.DatagramTransport | None = None
        self._handshaken = False
        self._wakeup: asyncio.Event = asyncio.Event()
        self._error: Exception | None = None
        ctx = SSL.Context(SSL.DTLS_CLIENT_METHOD)
        ctx.set_min_proto_version(DTLS1_2_VERSION)
        if tls.insecure:
            ctx.set_verify(SSL.VERIFY_NONE)
        else:
            ctx.set_verify(SSL.VERIFY_PEER)
            if tls.ca_file:
                try:
                    ctx.load_verify_locations(tls.ca_file)
                except SSL.Error as exc:
                    raise BadInputError(f"cannot load CA file {tls.ca_file!r}: {exc}") from None
            else:
                ctx.set_default_verify_paths()
        self._conn = SSL.Connection(ctx, None)
        self._conn.set_connect_state()
        self._conn.set_ciphertext_mtu(DTLS_MTU_BYTES)
        if tls.sni and not _is_ip(tls.sni):
            self._conn.set_tlsext_host_name(tls.sni.encode())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    async def handshake(self) -> None:
        while True:
            try:
                self._conn.do_handshake()
            except SSL.WantReadError:
                self._flush()
                timeout = self._conn.DTLSv1_get_timeout()
                self._wakeup.clear()
                try:
                    async with asyncio.timeout(timeout if timeout is not None else 1.0):
                        await self._wakeup.wait()
                except TimeoutError:
                    self._conn.DTLSv1_handle_timeout()
                if self._error is not None:
                    raise self._error from None
                continue
            break
        self._flush()
        if not self._tls.insecure:
            self._check_hostname()
        self._handshaken = True

    def _check_hostname(self) -> None:
        cert = self._conn.get_peer_certificate()
        if cert is None:
            raise SSL.Error("server sent no certificate")
        if not cert_matches(cert, self._host):
            raise SSL.Error(f"certificate does not match {self._host!r}")

    def _flush(self) -> None:
        try:
            out = self._conn.bio_read(DTLS_READ_BYTES)
        except SSL.WantReadError:
            return
        if out and self._transport is not None:
            for datagram in pack_records(out, DTLS_MTU_BYTES):
                self._transport.sendto(datagram)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._conn.bio_write(data)
        if not self._handshaken:
            self._wakeup.set()
            return
        while True:
            try:
                frame = self._conn.recv(DTLS_READ_BYTES)
            except SSL.WantReadError:
                break
            except SSL.ZeroReturnError:
                self._sink.carrier_lost(None)
                self.close()
                return
            except SSL.Error as exc:
                log.debug("dropping bad DTLS datagram: %s", exc)
                break
            self._sink.frame_received(frame)
        self._flush()

    def error_received(self, exc: Exception) -> None:
        if not self._handshaken:
            self._error = exc
            self._wakeup.set()
            return
        self._sink.carrier_lost(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshaken:
            self._sink.carrier_lost(exc)

    def send(self, frame: bytes) -> None:
        if not self._handshaken:
            return
        try:
            self._conn.send(frame)
        except SSL.Error as exc:
            log.debug("DTLS send failed: %s", exc)
            return
        self._flush()

    def close(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        if self._handshaken:
            with contextlib.suppress(SSL.Error):
                self._conn.shutdown()
            self._flush()
        self._transport.close()


def pack_records(data: bytes, mtu: int) -> list[bytes]:
    """Cut the concatenated DTLS records a memory BIO hands out into datagrams of at most `mtu`
    bytes, never splitting a record (RFC 6347 §4.1.1: a record must fit in one datagram)."""
    datagrams: list[bytes] = []
    current = bytearray()
    pos = 0
    while pos + DTLS_RECORD_HEADER.size <= len(data):
        length = DTLS_RECORD_HEADER.unpack_from(data, pos)[-1]
        end = pos + DTLS_RECORD_HEADER.size + length
        record = data[pos:end]
        if current and len(current) + len(record) > mtu:
            datagrams.append(bytes(current))
            current = bytearray()
        current += record
        pos = end
    if pos < len(data):
        current += data[pos:]  # not a whole record: pass it on as it is
    if current:
        datagrams.append(bytes(current))
    return datagrams


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def cert_matches(cert: crypto.X509, host: str) -> bool:
    """RFC 6125 matching of `host` against the certificate's subjectAltName (IP or DNS)."""
    from cryptography import x509

    c = cert.to_cryptography()
    try:
        san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    if _is_ip(host):
        want = ipaddress.ip_address(host)
        return any(ip == want for ip in san.get_values_for_type(x509.IPAddress))
    host = host.lower().rstrip(".")
    for name in san.get_values_for_type(x509.DNSName):
        name = name.lower().rstrip(".")
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False
