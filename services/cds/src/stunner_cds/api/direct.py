"""Direct writes of a change's frame to a watcher's connection (``stunner_cds.store.hub.Sink``).

A change fans out to every watcher of its config; sending it through each watcher's ASGI
``send`` wakes a task, encodes the text and serialises a frame per watcher, which at a thousand
watchers costs far more than the writes themselves. Under uvicorn's ``websockets-sansio``
protocol, which the CDS runs (``stunner_cds.server``), the hub instead writes the frame it built
once to each connection's transport. Only whole frames are written, only while the connection is
open, no close frame has gone out and the transport is below its high-water mark; otherwise the
frame is queued and the ASGI path sends it (and waits for the buffer to drain, under the send
watchdog). Keepalive pings and the close frame still go through uvicorn: each is one whole write,
so frames never interleave.

``ExposeProtocol`` is an ASGI middleware that puts the server's protocol object (the ``self`` of
the ``send`` callable the server hands over) into the scope, before Starlette wraps ``send``. Any
other server, or a wrapped ``send``, gets no sink: every frame then takes the ASGI path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

PROTOCOL_KEY = "stunner_cds.ws_protocol"
"""The scope key ``ExposeProtocol`` sets on a WebSocket scope."""


class ExposeProtocol:
    """ASGI middleware: a WebSocket scope gets the server's protocol object under
    ``PROTOCOL_KEY`` (None when ``send`` is not a bound method)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            scope[PROTOCOL_KEY] = getattr(send, "__self__", None)
        await self.app(scope, receive, send)


class UvicornSink:
    """A uvicorn ``websockets-sansio`` connection, written to directly."""

    __slots__ = ("_on_write", "_protocol")

    def __init__(self, protocol: WebSocketsSansIOProtocol, on_write: Callable[[], None]) -> None:
        self._protocol = protocol
        self._on_write = on_write

    def ready(self) -> bool:
        p = self._protocol
        return (
            p.writable.is_set()
            and not p.close_sent
            and p.conn.state is State.OPEN
            and not p.transport.is_closing()
        )

    def write(self, frame: bytes) -> None:
        self._protocol.transport.write(frame)
        self._on_write()


def sink_of(scope: Scope, on_write: Callable[[], None]) -> UvicornSink | None:
    """The direct sink of an accepted WebSocket's connection, or None (the ASGI path only)."""
    protocol: Any = scope.get(PROTOCOL_KEY)
    if not isinstance(protocol, WebSocketsSansIOProtocol) or not protocol.handshake_complete:
        return None
    if protocol.conn.state is not State.OPEN or getattr(protocol.conn, "extensions", None):
        return None  # an extension (permessage-deflate) would have to transform the frame
    return UvicornSink(protocol, on_write)
