"""A real stunnerd process driven through its config file, and TURN clients that echo through it.

`ManagedStunnerd` rewrites the config file atomically and waits on `/status` until the process
has taken (or rejected) the new config. `EchoAllocation` is one aioice TURN allocation that sends
to a UDP echo peer; `echoes()` tells whether data still flows through that same allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
from aioice.turn import TurnTransport, create_turn_endpoint

from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess, wait_for_tcp

USER, PASSWORD = "user1", "passwd1"
STEP_TIMEOUT_S = 20.0


WATCH_ID = "stunner/udp-gateway"


def watch_config(realm: str, port: int = 3478) -> dict[str, Any]:
    """A one-listener config as the CDS serves it for WATCH_ID; `realm` tells versions apart.

    The password holds `$` on purpose: credentials must reach stunnerd unexpanded.
    """
    return {
        "version": "v1",
        "admin": {"name": WATCH_ID},
        "auth": {
            "type": "static",
            "realm": realm,
            "credentials": {"username": "user", "password": "pa$$word"},
        },
        "listeners": [
            {"name": "udp", "protocol": "TURN-UDP", "address": "$STUNNER_ADDR", "port": port}
        ],
        "clusters": [],
    }


def base_config(
    health_port: int, ports: dict[str, int], peer_cluster: str = "echo"
) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {
            "name": "default/gw",
            "loglevel": "all:INFO",
            "healthcheck_endpoint": f"http://127.0.0.1:{health_port}",
        },
        "auth": {"type": "static", "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [
            {
                "name": name,
                "protocol": "TURN-UDP",
                "address": "127.0.0.1",
                "port": port,
                "routes": [peer_cluster],
            }
            for name, port in ports.items()
        ],
        "clusters": [
            {"name": "echo", "type": "STATIC", "endpoints": ["127.0.0.1"]},
            {"name": "elsewhere", "type": "STATIC", "endpoints": ["10.255.255.1"]},
        ],
    }


class ManagedStunnerd:
    """stunnerd on a config file (default), or with `origin` (e.g. a CDS URL) and `health`."""

    def __init__(
        self,
        tmp: Path,
        config: dict[str, Any] | None,
        *args: str,
        origin: str | None = None,
        health: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.path = tmp / "stunnerd.json"
        self.config = copy.deepcopy(config or {})
        if config is not None:
            self.path.write_text(json.dumps(self.config))
            self.health_port = int(config["admin"]["healthcheck_endpoint"].rsplit(":", 1)[1])
        if health is not None:
            self.health_port = health
        argv = [sys.executable, "-m", "stunnerd", "-c", origin or str(self.path)]
        full_env = {**os.environ, **(env or {})}
        if health is not None:
            full_env["STUNNERD_HEALTH_PORT"] = str(health)
        self.proc = ServerProcess(
            [*argv, "--bind", "127.0.0.1", *args], env=full_env, log_path=tmp / "stunnerd.log"
        )
        self.http = httpx.AsyncClient(timeout=2.0)

    async def status(self) -> dict[str, Any]:
        reply = await self.http.get(f"http://127.0.0.1:{self.health_port}/status")
        reply.raise_for_status()
        return dict(reply.json())

    async def get(self, path: str, port: int | None = None) -> httpx.Response:
        return await self.http.get(f"http://127.0.0.1:{port or self.health_port}{path}")

    async def wait_status(self, check: Any, what: str) -> dict[str, Any]:
        last: dict[str, Any] = {}
        deadline = asyncio.get_running_loop().time() + STEP_TIMEOUT_S
        while asyncio.get_running_loop().time() < deadline:
            if not self.proc.alive():
                raise AssertionError(f"stunnerd exited:\n{self.proc.output()[-3000:]}")
            try:
                last = await self.status()
                if check(last):
                    return last
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last status {last}\n{self.log()}")

    async def ready(self) -> dict[str, Any]:
        return await self.wait_status(lambda s: s.get("status") == "READY", "READY")

    async def write(self, config: dict[str, Any], *, expect: str = "applied") -> dict[str, Any]:
        """Replace the config file atomically and wait until stunnerd applied or rejected it."""
        before = (await self.status())["configs"][expect]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config))
        os.replace(tmp, self.path)
        status = await self.wait_status(
            lambda s: s["configs"][expect] > before, f"the config to be {expect}"
        )
        if expect == "applied":
            self.config = copy.deepcopy(config)
        return status

    def log(self) -> str:
        return self.proc.output()[-4000:]

    async def close(self) -> None:
        """Stop without waiting for allocations: a second SIGTERM ends the drain at once."""
        await self.http.aclose()
        if self.proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            # Signals of one kind coalesce while pending: send the second once the first landed.
            for _ in range(100):
                if not self.proc.alive() or "received: draining" in self.proc.output():
                    break
                await asyncio.sleep(0.02)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.stop()


class TurnReceiver(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: asyncio.Queue[bytes] = asyncio.Queue()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.put_nowait(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class EchoAllocation:
    """One TURN allocation (aioice) whose data goes to `peer` and comes back."""

    def __init__(
        self, transport: TurnTransport, receiver: TurnReceiver, peer: tuple[str, int]
    ) -> None:
        self.transport = transport
        self.receiver = receiver
        self.peer = peer
        self.sent = 0

    @property
    def relay(self) -> tuple[str, int]:
        return tuple(self.transport.get_extra_info("sockname"))  # type: ignore[return-value]

    @classmethod
    async def open(
        cls, port: int, peer: tuple[str, int], user: str = USER, password: str = PASSWORD
    ) -> EchoAllocation:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            transport, receiver = await create_turn_endpoint(
                TurnReceiver, server_addr=("127.0.0.1", port), username=user, password=password
            )
        return cls(transport, receiver, peer)

    async def echoes(self, wait_s: float = 2.0, tries: int = 3) -> bool:
        """Send a numbered datagram and report whether it came back through this allocation."""
        for _ in range(tries):
            self.sent += 1
            payload = f"ping-{id(self)}-{self.sent}".encode()
            self.transport.sendto(payload, self.peer)
            try:
                async with asyncio.timeout(wait_s / tries):
                    while (await self.receiver.received.get()) != payload:
                        pass
                return True
            except TimeoutError:
                continue
        return False

    async def close(self) -> None:
        """Delete the allocation (Refresh with lifetime 0) and wait until it is gone."""
        self.transport.close()
        try:
            async with asyncio.timeout(5):
                await self.receiver.lost
        except TimeoutError:
            self.abandon()

    def abandon(self) -> None:
        """Drop the client socket without telling the server (its allocation is gone anyway)."""
        inner = self.transport._TurnTransport__inner_protocol  # type: ignore[attr-defined]
        if inner.transport is not None:
            inner.transport.close()


def listener_ports(*names: str) -> dict[str, int]:
    return {name: free_udp_tcp_port() for name in names}


def health_port() -> int:
    return free_port()


class CdsServer:
    """The real `stunner-cds` process on a free port, reading the given Redis."""

    def __init__(self, redis_url: str, workdir: Path) -> None:
        self.port = free_port()
        self.redis_url = redis_url
        self.workdir = workdir
        self.proc: ServerProcess | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        argv = [sys.executable, "-m", "stunner_cds", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--redis-url", self.redis_url]
        self.proc = ServerProcess(argv, log_path=self.workdir / f"cds-{self.starts}.log")
        wait_for_tcp("127.0.0.1", self.port, proc=self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
