"""Helpers for the CDS integration tests: a real uvicorn CDS in-process on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from websockets.asyncio.client import ClientConnection

from stunner_cds.server import bound_port, build_server
from stunner_cds.settings import CdsSettings

STARTUP_TIMEOUT_S = 10.0
FRAME_TIMEOUT_S = 5.0
POLL_S = 0.01


@dataclass
class RunningCds:
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int
    settings: CdsSettings
    scheme: str = "http"

    @property
    def http_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"{'wss' if self.scheme == 'https' else 'ws'}://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        async with asyncio.timeout(STARTUP_TIMEOUT_S):
            await self.task


async def start_cds(redis_url: str, **overrides: Any) -> RunningCds:
    settings = CdsSettings(
        host="127.0.0.1", port=overrides.pop("port", 0), redis_url=redis_url, **overrides
    )
    server = build_server(settings)
    task = asyncio.create_task(server.serve(), name="test-cds-uvicorn")
    for _ in range(int(STARTUP_TIMEOUT_S / POLL_S)):
        if server.started:
            break
        if task.done():
            task.result()
            raise RuntimeError("uvicorn exited during startup")
        await asyncio.sleep(POLL_S)
    else:
        server.should_exit = True
        raise TimeoutError("uvicorn did not start")
    scheme = "https" if settings.tls_cert_file else "http"
    return RunningCds(server, task, bound_port(server), settings, scheme)


async def wait_ready(cds: RunningCds, **client_args: Any) -> None:
    """Poll /readyz (bounded) until the CDS has loaded the store."""
    async with (
        httpx.AsyncClient(base_url=cds.http_url, **client_args) as http,
        asyncio.timeout(STARTUP_TIMEOUT_S),
    ):
        for _ in range(int(STARTUP_TIMEOUT_S / POLL_S)):
            if (await http.get("/readyz")).status_code == 200:
                return
            await asyncio.sleep(POLL_S)
    raise TimeoutError("the CDS never became ready")


@contextlib.asynccontextmanager
async def running_cds(redis_url: str, **overrides: Any) -> AsyncIterator[RunningCds]:
    client_args = overrides.pop("client_args", {})
    cds = await start_cds(redis_url, **overrides)
    try:
        await wait_ready(cds, **client_args)
        yield cds
    finally:
        await cds.stop()


def config(config_id: str, realm: str = "stunner.l7mp.io", **extra: Any) -> dict[str, Any]:
    """A small valid stunnerd config for ``config_id`` (the operator would render this)."""
    body: dict[str, Any] = {
        "version": "v1",
        "admin": {"name": config_id, "loglevel": "all:INFO"},
        "auth": {
            "type": "static",
            "realm": realm,
            "credentials": {"username": "u", "password": "p"},
        },
        "listeners": [
            {"name": f"{config_id}/udp", "protocol": "TURN-UDP", "port": 3478, "routes": ["r"]}
        ],
        "clusters": [{"name": "r", "type": "STATIC", "protocol": "UDP", "endpoints": ["10.0.0.1"]}],
    }
    body.update(extra)
    return body


async def recv_json(ws: ClientConnection, timeout_s: float = FRAME_TIMEOUT_S) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):
        frame = await ws.recv()
    assert isinstance(frame, str), "the CDS sends text frames only"
    data = json.loads(frame)
    assert isinstance(data, dict)
    return data


async def recv_text(ws: ClientConnection, timeout_s: float = FRAME_TIMEOUT_S) -> str:
    async with asyncio.timeout(timeout_s):
        frame = await ws.recv()
    assert isinstance(frame, str), "the CDS sends text frames only"
    return frame


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, what: str = "condition"
) -> None:
    """Re-check ``check`` every few ms until it holds; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        for _ in range(int(timeout_s / POLL_S) + 1):
            if await check():
                return
            await asyncio.sleep(POLL_S)
    raise AssertionError(f"{what} did not hold within {timeout_s} s")


async def http_get(cds: RunningCds, path: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=cds.http_url) as http:
        return await http.get(path, **kwargs)


async def served_rev(cds: RunningCds) -> int:
    rev: int = (await http_get(cds, "/healthz")).json()["rev"]
    return rev


async def wait_rev(cds: RunningCds, rev: int | None) -> None:
    """Wait until the CDS holds revision ``rev`` (what a publisher write returned)."""
    target = rev or 0

    async def caught_up() -> bool:
        return await served_rev(cds) >= target

    await eventually(caught_up, what=f"CDS at revision {target}")
