"""Request limits enforced while uvicorn parses, before the app (or a WebSocket) sees a request.

uvicorn's httptools protocol buffers a request head of any size and has no deadline for a head
that never ends, so one client could hold memory and a connection slot forever. This subclass
counts the head's bytes as they arrive and refuses, with upstream's JSON error body and
``Connection: close``: a head larger than ``max_header_bytes`` (431), a query string longer than
``max_query_bytes`` (414), a body over ``max_body_bytes`` (413, from ``Content-Length`` before any
byte of it is read, or as a chunked body grows), a head not complete within
``request_head_timeout_s`` (408), and a request httptools cannot parse (400). WebSocket frames are
bounded by uvicorn's own ``ws_max_size`` (close code 1009).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from stunner_common.cds import encode_error

log = logging.getLogger(__name__)

LINGER_S = 1.0


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_header_bytes: int
    max_query_bytes: int
    max_body_bytes: int
    request_head_timeout_s: float


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a refused request."""


def refusal(code: int, message: str) -> bytes:
    """A complete HTTP/1.1 response carrying ``{"code": N, "message": ...}``, closing the link."""
    body = encode_error(code, message).encode()
    head = (
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n"
    )
    return STATUS_LINE[code] + head + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of ``RequestLimits`` (see the module doc)."""

    limits: RequestLimits  # set on the subclass that ``protocol_class`` makes

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
        self._body_bytes = 0
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

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
        self._body_bytes = 0
        self._arm_head_timer()

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

    def _refuse(self, code: int, message: str) -> None:
        """Answer (unless a response is already under way) and close; parse nothing more."""
        if self._refused:
            return
        self._refused = True
        self._cancel_head_timer()
        log.info("refused a request from %s: %d %s", _peer(self.client), code, message)
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        self.transport.write(refusal(code, message))
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


def protocol_class(limits: RequestLimits) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` bound to ``limits``."""

    class CdsHttpProtocol(LimitedHttpToolsProtocol):
        pass

    CdsHttpProtocol.limits = limits
    return CdsHttpProtocol


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"
