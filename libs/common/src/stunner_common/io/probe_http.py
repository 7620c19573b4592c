"""A minimal asyncio HTTP/1.1 server for GET probes (health, readiness, Prometheus scrapes).

Health checks and Prometheus scrapes send one small GET and read the reply, so the server reads
the request head under a timeout, answers with `Connection: close` and hangs up. Every connection
task is owned by the server and cancelled when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

REQUEST_HEAD_TIMEOUT_S = 5.0
MAX_REQUEST_HEAD_BYTES = 8192

_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    400: "Bad Request",
    503: "Service Unavailable",
    500: "Internal Server Error",
}


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json; charset=utf-8"


Handler = Callable[[str], Response | Awaitable[Response]]


class HttpServer:
    """Serve `handler(path)` for GET requests on host:port (port 0 picks a free one)."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handler: Handler,
        *,
        request_timeout_s: float = REQUEST_HEAD_TIMEOUT_S,
    ) -> None:
        self.request_timeout_s = request_timeout_s
        self.name = name
        self.host = host
        self.port = port
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def bound_port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self.port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        host = None if self.host in ("0.0.0.0", "::", "") else self.host
        sock = _literal_listener(host, self.port) if host is not None else None
        if sock is not None:
            self._server = await asyncio.start_server(self._on_connection, sock=sock)
        else:
            self._server = await asyncio.start_server(
                self._on_connection, host, self.port, reuse_address=True
            )
        log.info("%s server listening on %s:%d", self.name, self.host or "*", self.bound_port)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(self.request_timeout_s):
            head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_REQUEST_HEAD_BYTES:
            response = Response(400, b'{"status":400,"message":"request too large"}')
        else:
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(request_line) != 3:
                response = Response(400, b'{"status":400,"message":"malformed request"}')
            elif request_line[0] not in ("GET", "HEAD"):
                response = Response(405, b'{"status":405,"message":"only GET is supported"}')
            else:
                path = request_line[1].split("?", 1)[0]
                try:
                    result = self._handler(path)
                    response = await result if inspect.isawaitable(result) else result
                except Exception:
                    log.exception("%s handler failed for %s", self.name, path)
                    response = Response(500, b'{"status":500,"message":"internal error"}')
                if request_line[0] == "HEAD":
                    response = Response(response.status, b"", response.content_type)
        reason = _REASONS.get(response.status, "")
        writer.write(
            (
                f"HTTP/1.1 {response.status} {reason}\r\nContent-Type: {response.content_type}\r\n"
                f"Content-Length: {len(response.body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            + response.body
        )
        async with asyncio.timeout(self.request_timeout_s):
            await writer.drain()


def _literal_listener(host: str, port: int) -> socket.socket | None:
    """A listening socket on `host` when it is an IP address, else None (a name to resolve).

    An address needs no resolving, and handing the event loop a host string would load the
    "idna" codec (with stringprep and unicodedata) into the process for good.
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(100)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
