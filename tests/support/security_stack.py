"""The whole stack as separate processes, for fault injection and secret-leak tests.

Real redis-server, `stunner-operator --manifests` (local mode) on a copy of examples/local with
free ports and unique secrets, one or more `stunner-cds` replicas, and a `stunnerd` watching the
CDS, all on loopback, every log captured to a file. Components can be SIGKILLed and restarted
one at a time (same ports, same data). `SteadyRelay` is a TURN allocation (aioice) that sends
numbered datagrams to a UDP echo peer (`support.echo`) at a steady rate and counts what comes
back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from aioice.turn import create_turn_endpoint

from support.local_manifests import copy_local_examples
from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess, wait_for_tcp
from support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = "stunner/udp-gateway"
STEP_TIMEOUT_S = 30.0


class Secrets:
    """Values that must never show up in a log, `/status`, `/metrics` or an error message."""

    def __init__(self) -> None:
        tag = os.urandom(6).hex()
        self.user = "user-1"
        self.password = f"pw-{tag}-Zq"
        self.cds_token = f"tok-{tag}-Xy"

    def values(self) -> dict[str, str]:
        return {"password": self.password, "cds token": self.cds_token}


class Stack:
    """Processes are started by the methods below and all stopped by `close()`."""

    def __init__(
        self, tmp: Path, *, cds_replicas: int = 1, debug: bool = True, token: bool = True
    ) -> None:
        self.tmp = tmp
        self.logs = tmp / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.debug = debug
        self.secrets = Secrets()
        self.udp_port = free_udp_tcp_port()
        self.tcp_port = free_udp_tcp_port()
        self.manifests = copy_local_examples(tmp / "manifests", self.udp_port, self.tcp_port)
        config = self.manifests / "gatewayconfig.yaml"
        text = config.read_text().replace("pass-1", self.secrets.password)
        config.write_text(text.replace("logLevel: all:INFO", "logLevel: all:DEBUG"))
        (tmp / "redis").mkdir(exist_ok=True)
        self.redis = RedisServer(tmp / "redis")
        self.cds_ports = [free_port() for _ in range(cds_replicas)]
        self.health_port = free_port()
        # The CDS requires the token (CDS_TOKEN); stunnerd reads it from a file (rotatable).
        self.cds_token: str | None = self.secrets.cds_token if token else None
        self.token_file = tmp / "cds-token"
        if self.cds_token:
            self.token_file.write_text(self.cds_token + "\n")
        self.procs: dict[str, ServerProcess] = {}
        self.starts: dict[str, int] = {}
        self.env: dict[str, str] = {}
        self.http = httpx.AsyncClient(timeout=2.0)

    # ------------------------------------------------------------------ processes

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.starts[name] = self.starts.get(name, 0) + 1
        log = self.logs / f"{name}-{self.starts[name]}.log"
        self.procs[name] = ServerProcess(
            argv, cwd=ROOT, env={**os.environ, **self.env, **(env or {})}, log_path=log
        )

    def start_redis(self) -> None:
        self.redis.start()

    def start_operator(self) -> None:
        argv = [sys.executable, "-m", "stunner_operator", "--manifests", str(self.manifests)]
        argv += ["--redis-url", self.redis.url]
        # Its own ports: the defaults (8081, 8080) may be taken by a running stack or test.
        argv += ["--health-address", "", "--metrics-address", ""]
        if self.debug:
            argv += ["--log-level", "DEBUG"]
        self._start("operator", argv)

    def start_cds(self, index: int = 0) -> None:
        port = self.cds_ports[index]
        argv = [sys.executable, "-m", "stunner_cds", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--redis-url", self.redis.url]
        if self.debug:
            argv += ["--log-level", "DEBUG"]
        self._start(f"cds{index}", argv, {"CDS_TOKEN": self.cds_token} if self.cds_token else {})
        wait_for_tcp("127.0.0.1", port, timeout_s=STEP_TIMEOUT_S, proc=self.procs[f"cds{index}"])

    def cds_origin(self) -> str:
        return ",".join(f"ws://127.0.0.1:{port}" for port in self.cds_ports)

    def start_stunnerd(self, *extra: str, env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, "-m", "stunnerd", "-w", "-c", self.cds_origin(), "--id", GATEWAY]
        argv += ["--bind", "127.0.0.1", *extra]
        if self.cds_token:
            argv += ["--cds-token-file", str(self.token_file)]
        if self.debug:
            argv += ["-l", "all:DEBUG"]
        full_env = {
            "STUNNER_ADDR": "127.0.0.1",
            "STUNNERD_HEALTH_PORT": str(self.health_port),
            "STUNNERD_METRICS_PORT": str(free_port()),  # where a config turns metrics on
            **(env or {}),
        }
        self._start("stunnerd", argv, full_env)

    def start_all(self) -> None:
        self.start_redis()
        self.start_operator()
        for index in range(len(self.cds_ports)):
            self.start_cds(index)
        self.start_stunnerd()

    def kill(self, name: str) -> None:
        """SIGKILL one component (no goodbye, as a crash or an OOM kill)."""
        if name == "redis":
            self.redis.stop(kill=True)
            return
        self.procs[name].stop(signal.SIGKILL)

    async def restart_soon(self, name: str) -> None:
        """`restart` off the event loop, so that the traffic of the test keeps flowing."""
        await asyncio.to_thread(self.restart, name)

    def restart(self, name: str) -> None:
        if name == "redis":
            self.redis.start()
        elif name == "operator":
            self.start_operator()
        elif name.startswith("cds"):
            self.start_cds(int(name[3:]))
        else:
            raise ValueError(name)

    def wipe_redis(self) -> None:
        """Forget everything Redis stored (its append-only files), as a fresh Redis pod."""
        for path in (self.tmp / "redis").iterdir():
            if path.name.startswith("appendonly") or path.suffix == ".rdb":
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()

    async def close(self) -> None:
        await self.http.aclose()
        for name, proc in reversed(list(self.procs.items())):
            # stunnerd would drain its allocations for the grace period: not in a test
            proc.stop(signal.SIGKILL if name == "stunnerd" else signal.SIGTERM)
        self.redis.stop()

    def all_logs(self) -> dict[str, str]:
        out = {p.name: p.read_text(errors="replace") for p in sorted(self.logs.iterdir())}
        for path in (self.tmp / "redis").glob("*.log"):
            out[path.name] = path.read_text(errors="replace")
        return out

    # ------------------------------------------------------------------ observations

    async def status(self) -> dict[str, Any]:
        reply = await self.http.get(f"http://127.0.0.1:{self.health_port}/status")
        reply.raise_for_status()
        return dict(reply.json())

    async def wait_status(self, check: Any, what: str, timeout_s: float = STEP_TIMEOUT_S) -> float:
        """Poll `/status` until `check(status)`; returns the seconds it took."""
        started = time.monotonic()
        last: dict[str, Any] = {}
        while time.monotonic() - started < timeout_s:
            proc = self.procs.get("stunnerd")
            if proc is not None and not proc.alive():
                raise AssertionError(f"stunnerd exited:\n{proc.output()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                last = await self.status()
                if check(last):
                    return time.monotonic() - started
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}; last status {last}\n{self.tail()}")

    async def ready(self) -> None:
        await self.wait_status(
            lambda s: s.get("status") == "READY" and bool(s.get("listeners")), "stunnerd READY"
        )

    def tail(self) -> str:
        return "\n".join(f"--- {n}\n{t[-1500:]}" for n, t in self.all_logs().items())

    def endpoints_of(self, status: dict[str, Any]) -> list[str]:
        return sorted(e for c in status.get("clusters", []) for e in c["endpoints"])

    def add_prefix(self, prefix: str) -> None:
        """Edit the StaticService of the route: one more prefix (applies in place, no restart)."""
        route = self.manifests / "route.yaml"
        text = route.read_text()
        route.write_text(text.replace("    - 127.0.0.1/32", f"    - 127.0.0.1/32\n    - {prefix}"))

    def grep(self, text: str) -> list[str]:
        """Every log line (of every process) that holds `text`."""
        return [
            f"{name}: {line}"
            for name, body in self.all_logs().items()
            for line in body.splitlines()
            if text in line
        ]


@contextlib.asynccontextmanager
async def running_stack(tmp: Path, **kwargs: Any) -> AsyncIterator[Stack]:
    stack = Stack(tmp, **kwargs)
    try:
        stack.start_all()
        await stack.ready()
        yield stack
    finally:
        await stack.close()


# ----------------------------------------------------------------------- traffic


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.arrived = asyncio.Event()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if data.startswith(b"seq-"):
            self.seen.add(int(data[4:]))
            self.arrived.set()


class SteadyRelay:
    """One allocation sending `seq-N` every `interval_s` to the echo peer, counting echoes."""

    def __init__(self, port: int, peer: tuple[str, int], user: str, password: str) -> None:
        self.port, self.peer, self.user, self.password = port, peer, user, password
        self.sent = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SteadyRelay:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            self.transport, self.receiver = await create_turn_endpoint(
                _Receiver,
                server_addr=("127.0.0.1", self.port),
                username=self.user,
                password=self.password,
                channel_refresh_time=60,
            )
        self._task = asyncio.create_task(self._send(0.01), name="steady-relay")
        return self

    async def _send(self, interval_s: float) -> None:
        while True:
            self.transport.sendto(f"seq-{self.sent}".encode(), self.peer)
            self.sent += 1
            await asyncio.sleep(interval_s)

    def received(self) -> int:
        return len(self.receiver.seen)

    async def stop(self) -> int:
        """Stop sending, give the last datagrams time to come back; return how many were lost."""
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(3.0):
                while self.received() < self.sent:
                    self.receiver.arrived.clear()
                    await self.receiver.arrived.wait()
        return self.sent - self.received()

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.transport.close()
