"""Admin servers on listening sockets handed over by a previous stunnerd (hot handoff).

A successor serves /healthz, /ready, /status and /metrics on the very sockets the old process
bound (the kernel queues connections on them throughout), so a probe never meets a closed port
and nothing is bound twice on a host-network node.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence
from typing import Any

from stunnerd.admin.endpoint import BindAddress
from stunnerd.admin.http import Handler, HttpServer
from stunnerd.handoff.transport.named import NamedSocket

log = logging.getLogger(__name__)


class HandedHttpServer(HttpServer):
    """An admin server on listening sockets a previous stunnerd handed over (hot handoff): it
    accepts on the very sockets the old process bound, so probes never meet a closed port."""

    def __init__(
        self,
        name: str,
        at: BindAddress,
        handler: Handler,
        socks: Sequence[socket.socket],
        **kw: Any,
    ) -> None:
        super().__init__(name, at.host, at.port, handler, **kw)
        self._socks = [s.dup() for s in socks]
        self._servers: list[asyncio.Server] = []

    @property
    def bound_port(self) -> int:
        return int(self._socks[0].getsockname()[1]) if self._socks else self.port

    async def start(self) -> None:
        for sock in self._socks:
            self._servers.append(await asyncio.start_server(self._on_connection, sock=sock))
        log.info("%s server serving on %s:%d (handed over)", self.name, self.host, self.bound_port)

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers = []


def listening_sockets(name: str, server: HttpServer | None) -> list[NamedSocket]:
    """The listening sockets of an admin server, as the handoff names them."""
    if server is None:
        return []
    if isinstance(server, HandedHttpServer):
        socks = [s for srv in server._servers for s in srv.sockets]
    else:
        socks = list(server._server.sockets) if server._server is not None else []
    return [NamedSocket(name, server.host, int(s.getsockname()[1]), s) for s in socks]


async def close_gently(server: HttpServer | None, timeout_s: float) -> None:
    """Stop accepting, let the requests in flight finish (within `timeout_s`), then close: a
    successor accepts on the same sockets, so no probe should see its connection cut."""
    if server is None:
        return
    if isinstance(server, HandedHttpServer):
        for one in server._servers:
            one.close()
    elif server._server is not None:
        server._server.close()
    if server._conns:
        await asyncio.wait(set(server._conns), timeout=timeout_s)
    await server.close()
