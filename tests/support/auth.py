"""A real auth service in-process on 127.0.0.1:0, fed by a real CDS over a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from stunner_auth.__main__ import build_server
from stunner_auth.settings import AuthSettings

STARTUP_TIMEOUT_S = 10.0
POLL_S = 0.02


@dataclass
class RunningAuth:
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def running_auth(
    cds_url: str, *, ready: bool = True, **overrides: Any
) -> AsyncIterator[RunningAuth]:
    """Start the service and (unless `ready` is False) wait until ``/readyz`` answers 200."""
    settings = AuthSettings(host="127.0.0.1", port=0, cds_url=cds_url, **overrides)
    server = build_server(settings)
    task = asyncio.create_task(server.serve(), name="test-auth-uvicorn")
    try:
        for _ in range(int(STARTUP_TIMEOUT_S / POLL_S)):
            if server.started:
                break
            if task.done():
                task.result()
                raise RuntimeError("uvicorn exited during startup")
            await asyncio.sleep(POLL_S)
        else:
            raise TimeoutError("uvicorn did not start")
        port = int(server.servers[0].sockets[0].getsockname()[1])
        running = RunningAuth(server, task, port)
        if ready:
            await eventually_ok(f"{running.url}/readyz")
        yield running
    finally:
        server.should_exit = True
        async with asyncio.timeout(STARTUP_TIMEOUT_S):
            await task


async def eventually_ok(url: str, timeout_s: float = STARTUP_TIMEOUT_S) -> httpx.Response:
    """GET `url` until it answers 200 (bounded)."""
    async with httpx.AsyncClient() as http:
        for _ in range(int(timeout_s / POLL_S)):
            resp = await http.get(url)
            if resp.status_code == 200:
                return resp
            await asyncio.sleep(POLL_S)
    raise TimeoutError(f"{url} never answered 200: {resp.status_code} {resp.text}")
