"""Request and connection limits enforced while uvicorn parses, before the app sees a request.

uvicorn's httptools protocol buffers a request head of any size and has no deadline for a head
that never ends, so one client could hold memory and a connection slot forever; h11's protocol
bounds the head but not its time, the URI or the body. This subclass counts the head's bytes as
they arrive and refuses, with the service's JSON error body and ``Connection: close``: a head
larger than ``max_header_bytes`` (431), a query string longer than ``max_query_bytes`` (414), a
body over ``max_body_bytes`` (413, from ``Content-Length`` before any byte of it is read, or as a
chunked body grows), a head not complete within ``request_head_timeout_s`` (408), a request
httptools cannot parse (400), and a connection past ``max_connections_per_client`` open HTTP
connections from one IP (429, before anything is read). A connection upgraded to a WebSocket
leaves that count: the service bounds its WebSockets itself. Each refusal calls ``on_refusal``
with the limit's name (for a counter) and is logged once per client and minute.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from stunner_common.io.http.errors import GO_STYLE, ErrorStyle

__all__ = [
    "LIMIT_NAMES",
    "LimitedHttpToolsProtocol",
    "RefusalLog",
    "RequestLimits",
    "protocol_class",
    "refusal",
]

log = logging.getLogger(__name__)

LINGER_S = 1.0
LOG_INTERVAL_S = 60.0

LIMIT_NAMES = {
    400: "invalid_request",
    408: "request_head_timeout",
    413: "body_bytes",
    414: "query_bytes",
    429: "connections_per_client",
    431: "header_bytes",
}
"""The ``limit`` label of each refusal, by the status it is answered with."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_header_bytes: int
    max_query_bytes: int
    max_body_bytes: int
    request_head_timeout_s: float
    max_connections_per_client: int = 0
    """Open HTTP (not upgraded) connections per client IP; 0: unlimited."""


@dataclass(frozen=True, slots=True)
class _ServerShared:
    """What every connection of one server shares."""

    on_refusal: Callable[[str], None]
    refusal_log: RefusalLog
    open_per_client: dict[str, int]


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a refused request."""


class RefusalLog:
    """One log line per client and minute: the first refusal in full, then how many followed.

    At most ``max_clients`` clients are remembered (the oldest is forgotten first), so a spray
    of source addresses costs a bounded table and, at worst, a line per forgotten client.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = LOG_INTERVAL_S,
        max_clients: int = 4096,
    ) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._max_clients = max_clients
        self._seen: dict[str, tuple[float, int]] = {}  # client -> (logged at, refusals since)

    def refused(self, client: str, code: int, message: str, now: float) -> None:
        seen = self._seen.get(client)
        if seen is not None and now - seen[0] < self._interval_s:
            self._seen[client] = (seen[0], seen[1] + 1)
            return
        more = f" (and {seen[1]} more in the last minute)" if seen and seen[1] else ""
        self._log.info("refused a request from %s: %d %s%s", client, code, message, more)
        self._seen.pop(client, None)
        self._seen[client] = (now, 0)
        while len(self._seen) > self._max_clients:
            del self._seen[next(iter(self._seen))]


def refusal(code: int, message: str, errors: ErrorStyle = GO_STYLE) -> bytes:
    """A complete HTTP/1.1 response carrying ``{"code": N, "message": ...}``, closing the link."""
    body = errors.body(code, message)
    head = (
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n"
    )
    return STATUS_LINE[code] + head + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of ``RequestLimits`` (see the module doc).

    `protocol_class` makes a subclass per server holding its limits, error style, counter
    callback, refusal log and the table of open connections per client IP.
    """

    limits: ClassVar[RequestLimits]
    errors: ClassVar[ErrorStyle]
    shared: ClassVar[_ServerShared]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_open = True
        self._head_bytes = 0
        self._parsed_head = 0
        self._body_bytes = 0
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._slot: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._take_slot():
            self._refuse(
                429,
                "too many connections from this client "
                f"(limit {self.limits.max_connections_per_client})",
            )
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._release_slot()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        self._release_slot()  # the transport leaves this protocol: its close is not ours to see
        super().handle_websocket_upgrade()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head_open:
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(431, "request header fields too large")
                return
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_open and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(
                431,
                f"request header fields too large (limit {self.limits.max_header_bytes} bytes)",
            )

    def send_400_response(self, msg: str) -> None:
        if not self._refused:
            self._refuse(400, "invalid HTTP request")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open = True
        self._parsed_head = 0
        self._body_bytes = 0
        self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._parsed_head += len(url)
        self._check_parsed_head()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_head += len(name) + len(value) + 4
        self._check_parsed_head()
        super().on_header(name, value)

    def _check_parsed_head(self) -> None:
        """A head that arrives whole in one read is parsed before `data_received` can count it."""
        if self._parsed_head > self.limits.max_header_bytes:
            self._refuse(
                431,
                f"request header fields too large (limit {self.limits.max_header_bytes} bytes)",
            )
            raise _Refused

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._head_bytes = 0
        self._cancel_head_timer()
        _, _, query = self.url.partition(b"?")
        if len(query) > self.limits.max_query_bytes:
            self._refuse(414, f"query string too long (limit {self.limits.max_query_bytes} bytes)")
            raise _Refused
        length = _content_length(self.headers)
        if length is not None and length > self.limits.max_body_bytes:
            self._refuse(413, f"request body too large (limit {self.limits.max_body_bytes} bytes)")
            raise _Refused
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:
            self._refuse(413, f"request body too large (limit {self.limits.max_body_bytes} bytes)")
            raise _Refused
        super().on_body(body)

    def _take_slot(self) -> bool:
        limit = self.limits.max_connections_per_client
        if not limit or self.client is None:
            return True
        ip = self.client[0]
        held = self.shared.open_per_client.get(ip, 0)
        if held >= limit:
            return False
        self.shared.open_per_client[ip] = held + 1
        self._slot = ip
        return True

    def _release_slot(self) -> None:
        ip, self._slot = self._slot, None
        if ip is None:
            return
        held = self.shared.open_per_client.get(ip, 0) - 1
        if held > 0:
            self.shared.open_per_client[ip] = held
        else:
            self.shared.open_per_client.pop(ip, None)

    def _refuse(self, code: int, message: str) -> None:
        """Answer (unless a response is already under way) and close; parse nothing more."""
        if self._refused:
            return
        self._refused = True
        self._cancel_head_timer()
        self.shared.on_refusal(LIMIT_NAMES[code])
        client = self.client[0] if self.client else "?"
        self.shared.refusal_log.refused(client, code, message, self.loop.time())
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        self.transport.write(refusal(code, message, self.errors))
        if self.scheme == "https" or not self.transport.can_write_eof():
            self.transport.close()
            return
        # A lingering close: closing with unread input would reset the connection and could
        # destroy the answer before the client reads it, so half-close and discard for a while.
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.limits.request_head_timeout_s, self._head_timed_out
            )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._head_open and not self.transport.is_closing():
            self._refuse(
                408,
                f"request header not complete within {self.limits.request_head_timeout_s:g} s",
            )


def _ignore(_: str) -> None:
    pass


def protocol_class(
    limits: RequestLimits,
    *,
    errors: ErrorStyle = GO_STYLE,
    on_refusal: Callable[[str], None] = _ignore,
    logger: logging.Logger = log,
) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` bound to ``limits``: refusals are
    worded in ``errors``, counted through ``on_refusal(limit)`` and logged to ``logger``."""

    class LimitedHttpProtocol(LimitedHttpToolsProtocol):
        pass

    LimitedHttpProtocol.limits = limits
    LimitedHttpProtocol.errors = errors
    LimitedHttpProtocol.shared = _ServerShared(on_refusal, RefusalLog(logger), {})
    return LimitedHttpProtocol


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
