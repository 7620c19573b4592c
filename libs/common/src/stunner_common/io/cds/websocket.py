"""The WebSocket client of the CDS watch (RFC 6455), on asyncio streams.

Only what a watch needs: the opening handshake with subprotocols, an Origin and extra headers,
over TCP or TLS; text and binary messages in, fragmented or not, up to a size limit; pings
answered; a keepalive ping with a deadline for its pong; the closing handshake both ways. No
extension is offered (so no compression), no proxy is used. A stunnerd following a CDS holds one
such connection for its lifetime, and this module is all it imports for it (a general-purpose
WebSocket library brings HTTP, e-mail, proxy and packaging modules into every dataplane pod).

A background task reads the connection: it answers pings and notes pongs at once, however slowly
the messages are taken, and queues at most ``MAX_QUEUE`` messages before it stops reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from base64 import b64encode
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from urllib.parse import urlsplit

from stunner_common.wsframe import (
    BINARY,
    CLOSE,
    CONTINUATION,
    PING,
    PONG,
    TEXT,
    FrameError,
    Header,
    accept_key,
    close_payload,
    encode_frame,
    parse_close,
)

__all__ = [
    "CLOSE_TIMEOUT_S",
    "MAX_QUEUE",
    "ConnectionClosed",
    "HandshakeError",
    "UpgradeRefused",
    "WebSocket",
    "WebSocketError",
    "connect",
]

log = logging.getLogger(__name__)

MAX_QUEUE = 16
CLOSE_TIMEOUT_S = 2.0
MAX_HEAD_BYTES = 64 * 1024
"""The most an answer's status line and headers, or a refusal's body, may take."""


class WebSocketError(Exception):
    """Any failure of a WebSocket connection or its opening."""


class HandshakeError(WebSocketError):
    """The server's answer to the upgrade is not a valid WebSocket handshake."""


class UpgradeRefused(HandshakeError):
    """The server answered the upgrade with another HTTP status (its body: up to 64 KiB)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        super().__init__(f"server refused the WebSocket upgrade with HTTP {status}")
        self.status = status
        self.headers = dict(headers)
        self.body = body


class ConnectionClosed(WebSocketError):
    """The connection ended; ``code`` and ``reason`` are those of the close frame (1006: none)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"WebSocket closed with {code}" + (f" ({reason})" if reason else ""))
        self.code = code
        self.reason = reason

    @property
    def ok(self) -> bool:
        """A normal closure (1000) or the server going away (1001)."""
        return self.code in (1000, 1001)


async def connect(
    url: str,
    *,
    subprotocols: Sequence[str] = (),
    origin: str | None = None,
    headers: Mapping[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    ping_interval_s: float | None = None,
    ping_timeout_s: float | None = None,
    max_size: int = 1 << 20,
) -> WebSocket:
    """Open a WebSocket to a ``ws://`` or ``wss://`` URL; the caller bounds it with a timeout.

    Raises ``UpgradeRefused`` for an answer other than 101, ``HandshakeError`` for a 101 that
    breaks the handshake's rules or a URL that is not ws(s), ``OSError`` when the connection
    fails.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise HandshakeError(f"not a ws:// or wss:// URL: {url!r}")
    tls = parts.scheme == "wss"
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError as exc:
        raise HandshakeError(f"invalid port in {url!r}") from exc
    context: ssl.SSLContext | None = None
    if tls:
        context = ssl_context if ssl_context is not None else ssl.create_default_context()
    reader, writer = await asyncio.open_connection(
        parts.hostname,
        port,
        ssl=context,
        server_hostname=parts.hostname if tls else None,
        limit=MAX_HEAD_BYTES,
    )
    try:
        key = b64encode(os.urandom(16)).decode()
        request = [
            f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if subprotocols:
            request.append(f"Sec-WebSocket-Protocol: {', '.join(subprotocols)}")
        if origin is not None:
            request.append(f"Origin: {origin}")
        request.extend(f"{name}: {value}" for name, value in (headers or {}).items())
        writer.write(("\r\n".join(request) + "\r\n\r\n").encode())
        status, answer = await _read_head(reader)
        if status != 101:
            raise UpgradeRefused(status, answer, await _read_body(reader, answer))
        subprotocol = _check_upgrade(answer, key, subprotocols)
    except BaseException:
        writer.close()
        raise
    return WebSocket(
        reader,
        writer,
        subprotocol=subprotocol,
        headers=answer,
        ping_interval_s=ping_interval_s,
        ping_timeout_s=ping_timeout_s,
        max_size=max_size,
    )


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status and headers (names in lower case; repeated ones joined with ", ")."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise HandshakeError("the server's answer has more than 64 KiB of headers") from exc
    except asyncio.IncompleteReadError as exc:
        raise HandshakeError("the server closed the connection during the handshake") from exc
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest.partition(" ")[0]
    if not version.startswith("HTTP/1.") or not (code.isdigit() and len(code) == 3):
        raise HandshakeError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    answer: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HandshakeError(f"invalid header line {line[:80]!r}")
        name, value = name.lower(), value.strip()
        answer[name] = f"{answer[name]}, {value}" if name in answer else value
    return int(code), answer


async def _read_body(reader: asyncio.StreamReader, answer: Mapping[str, str]) -> bytes:
    """A refusal's body: by its Content-Length, its chunks, or up to the end, at most 64 KiB."""
    try:
        if "content-length" in answer:
            size = int(answer["content-length"])
            return await reader.readexactly(min(max(size, 0), MAX_HEAD_BYTES))
        if "chunked" in answer.get("transfer-encoding", "").lower():
            body = bytearray()
            while len(body) < MAX_HEAD_BYTES:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    break
                body += await reader.readexactly(min(size, MAX_HEAD_BYTES))
                await reader.readexactly(2)
            return bytes(body[:MAX_HEAD_BYTES])
        return await reader.read(MAX_HEAD_BYTES)
    except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        return b""


def _check_upgrade(answer: Mapping[str, str], key: str, offered: Sequence[str]) -> str | None:
    """Check a 101 answer (RFC 6455 section 4.1, the client's checks) and return the subprotocol
    the server chose, if any."""
    if answer.get("upgrade", "").lower() != "websocket":
        raise HandshakeError("the answer's Upgrade header is not websocket")
    if "upgrade" not in (t.strip().lower() for t in answer.get("connection", "").split(",")):
        raise HandshakeError("the answer's Connection header lacks upgrade")
    if answer.get("sec-websocket-accept") != accept_key(key):
        raise HandshakeError("the answer's Sec-WebSocket-Accept does not match the key")
    if answer.get("sec-websocket-extensions"):
        raise HandshakeError("the server chose an extension that was not offered")
    chosen = answer.get("sec-websocket-protocol")
    if chosen is not None and chosen not in offered:
        raise HandshakeError(f"the server chose subprotocol {chosen!r}, which was not offered")
    return chosen


class WebSocket:
    """An open connection: iterate it (or ``recv``) for messages, ``close`` it when done.

    Iteration ends when the server closes normally (1000 or 1001) and raises
    ``ConnectionClosed`` for any other end; ``recv`` raises it for every end.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        subprotocol: str | None,
        headers: Mapping[str, str],
        ping_interval_s: float | None,
        ping_timeout_s: float | None,
        max_size: int,
    ) -> None:
        self.subprotocol = subprotocol
        self.headers = dict(headers)
        """The handshake answer's headers, names in lower case."""
        self._reader = reader
        self._writer = writer
        self._max_size = max_size
        self._messages: deque[str | bytes] = deque()
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._closed: ConnectionClosed | None = None
        self._close_sent = False
        self._pongs: dict[bytes, asyncio.Future[None]] = {}
        self._reading = asyncio.create_task(self._read_loop(), name="websocket-reader")
        self._keepalive: asyncio.Task[None] | None = None
        if ping_interval_s is not None:
            self._keepalive = asyncio.create_task(
                self._keepalive_loop(ping_interval_s, ping_timeout_s), name="websocket-keepalive"
            )

    async def __aenter__(self) -> WebSocket:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def __aiter__(self) -> AsyncIterator[str | bytes]:
        while True:
            try:
                yield await self.recv()
            except ConnectionClosed as closed:
                if closed.ok:
                    return
                raise

    async def recv(self) -> str | bytes:
        """The next message: ``str`` for text, ``bytes`` for binary."""
        while not self._messages:
            if self._closed is not None:
                raise self._closed  # after every message that came before the end
            self._arrived.clear()
            await self._arrived.wait()
        self._room.set()
        return self._messages.popleft()

    def ping(self) -> asyncio.Future[None]:
        """Send a ping; the future is done when its pong arrives."""
        data = os.urandom(4)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs[data] = waiter
        self._send(PING, data)
        return waiter

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close both ways: send a close frame, wait a little for the server's, then hang up."""
        try:
            if self._closed is None:
                self._send_close(code, reason)
                # What was not taken is not wanted now: the reader drops the rest on its way to
                # the server's close frame.
                self._messages.clear()
                self._room.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await asyncio.shield(self._reading)
        finally:
            await self._shutdown()  # even when the caller is cancelled meanwhile

    # --- internals --------------------------------------------------------------------------

    def _send(self, opcode: int, payload: bytes) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode_frame(opcode, payload, os.urandom(4)))

    def _send_close(self, code: int, reason: str = "") -> None:
        if not self._close_sent:
            self._close_sent = True
            self._send(CLOSE, close_payload(code, reason) if code != 1005 else b"")

    async def _read_loop(self) -> None:
        try:
            while True:
                message = await self._read_message()
                if message is None:
                    return
                if self._close_sent:
                    continue
                while len(self._messages) >= MAX_QUEUE:
                    self._room.clear()
                    await self._room.wait()
                self._messages.append(message)
                self._arrived.set()
        except FrameError as exc:
            self._send_close(exc.code, exc.reason)
            self._end(ConnectionClosed(exc.code, exc.reason))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ssl.SSLError) as exc:
            self._end(ConnectionClosed(1006, str(exc) or type(exc).__name__))
        finally:
            self._end(ConnectionClosed(1006, "the connection ended"))
            self._writer.close()

    async def _read_message(self) -> str | bytes | None:
        """The next data message; None once the close handshake is done."""
        kind: int | None = None
        parts: list[bytes] = []
        size = 0
        while True:
            header = Header.parse(await self._reader.readexactly(2), from_server=True)
            extra = await self._reader.readexactly(header.extra) if header.extra else b""
            length = header.payload_length(extra)
            if header.opcode in (TEXT, BINARY, CONTINUATION):
                size += length
                if size > self._max_size:
                    raise FrameError(1009, f"a message over {self._max_size} bytes")
            payload = await self._reader.readexactly(length)
            if header.opcode == PING:
                self._send(PONG, payload)
            elif header.opcode == PONG:
                waiter = self._pongs.pop(payload, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif header.opcode == CLOSE:
                code, reason = parse_close(payload)
                self._send_close(code, reason)
                self._end(ConnectionClosed(code, reason))
                return None
            else:
                if (header.opcode == CONTINUATION) != (kind is not None):
                    raise FrameError(1002, "a fragment out of order")
                kind = header.opcode if kind is None else kind
                parts.append(payload)
                if header.fin:
                    data = b"".join(parts)
                    if kind == BINARY:
                        return data
                    try:
                        return data.decode()
                    except UnicodeDecodeError as exc:
                        raise FrameError(1007, "a text message that is not UTF-8") from exc

    async def _keepalive_loop(self, interval_s: float, timeout_s: float | None) -> None:
        while self._closed is None:
            await asyncio.sleep(interval_s)
            if self._closed is not None:
                return
            pong = self.ping()
            try:
                async with asyncio.timeout(timeout_s):
                    await pong
            except TimeoutError:
                log.debug("no pong within %s s: dropping the connection", timeout_s)
                self._send_close(1011, "keepalive ping timeout")
                self._end(ConnectionClosed(1011, "keepalive ping timeout"))
                self._writer.close()
                return

    def _end(self, closed: ConnectionClosed) -> None:
        """Record the first end and hand it to ``recv`` after the messages already queued."""
        if self._closed is not None:
            return
        self._closed = closed
        for waiter in self._pongs.values():
            waiter.cancel()
        self._pongs.clear()
        self._arrived.set()

    async def _shutdown(self) -> None:
        tasks = [t for t in (self._keepalive, self._reading) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        self._writer.close()
        if tasks:
            await asyncio.wait(tasks)  # a cancellation of the caller still reaches the caller
        with contextlib.suppress(OSError, TimeoutError, ssl.SSLError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._writer.wait_closed()
