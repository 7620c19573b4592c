"""Upstream STUNner v1.2.1 (Go) as a test peer: its stunnerd, turncat and stunnerctl, and the
stack they meet ours on (a real redis-server, our CDS process and the operator's publisher).

The binaries come from ``support.gobin`` (pinned module versions, built once per machine into a
cache outside the work tree). ``upstream_bin()`` skips a test where Go is absent or the build
cannot run, and fails it under ``CI=true``.

Upstream's flags differ from ours in ways the helpers hide: the CDS address of turncat and
stunnerctl is a host (``--cds-server-address``) plus ``--cds-server-port``; stunnerd takes its
health endpoint from the config (``admin.healthcheck_endpoint``, default ``http://:8086``), so
every config here names a free loopback port; its UDP listeners bind the wildcard address.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from stunner_common.cds.wire import encode_v1_config
from stunner_common.config import self_signed_pair
from stunner_common.io.store import ConfigPublisher
from support import gobin
from support.cds_server import CdsServer
from support.ports import LOOPBACK, free_port, free_udp_tcp_port
from support.processes import ServerProcess, which
from support.redis_server import RedisServer
from support.turncat_harness import Turncat, start_logged

STEP_TIMEOUT_S = 20.0
POLL_S = 0.05
GATEWAY = "stunner/udp-gateway"
USER, PASSWORD, SECRET, REALM = "user1", "pa$$word1", "my-shared-secret", "stunner.l7mp.io"
PROTOCOLS = ("TURN-UDP", "TURN-TCP", "TURN-TLS", "TURN-DTLS")
LISTENER = {"TURN-UDP": "udp", "TURN-TCP": "tcp", "TURN-TLS": "tls", "TURN-DTLS": "dtls"}
STATIC: dict[str, Any] = {
    "type": "static",
    "realm": REALM,
    "credentials": {"username": USER, "password": PASSWORD},
}
EPHEMERAL: dict[str, Any] = {"type": "ephemeral", "realm": REALM, "credentials": {"secret": SECRET}}


@dataclass
class Gateway:
    """A gateway config on free loopback ports: one listener per protocol, a health port."""

    ports: dict[str, int]
    health_port: int
    cert: str
    key: str

    @classmethod
    def on_free_ports(cls) -> Gateway:
        cert, key = self_signed_pair(LOOPBACK)
        # Upstream's UDP listeners bind the wildcard address: the port must be free there too.
        ports = {proto: free_udp_tcp_port("0.0.0.0") for proto in PROTOCOLS}
        return cls(ports, free_port(), cert, key)

    def config(
        self,
        auth: dict[str, Any],
        *,
        protocols: tuple[str, ...] = PROTOCOLS,
        gateway: str = GATEWAY,
        address: str = LOOPBACK,
        public: bool = True,
        endpoints: tuple[str, ...] = ("127.0.0.1",),
    ) -> dict[str, Any]:
        listeners = []
        for proto in protocols:
            listener: dict[str, Any] = {
                "name": f"{gateway}/{LISTENER[proto]}",
                "protocol": proto,
                "address": address,
                "port": self.ports[proto],
                "routes": ["stunner/echo"],
            }
            if public:
                listener |= {"public_address": LOOPBACK, "public_port": self.ports[proto]}
            if proto in ("TURN-TLS", "TURN-DTLS"):
                listener |= {"cert": self.cert, "key": self.key}
            listeners.append(listener)
        return {
            "version": "v1",
            "admin": {
                "name": gateway,
                "loglevel": "all:INFO",
                "healthcheck_endpoint": f"http://{LOOPBACK}:{self.health_port}",
            },
            "auth": auth,
            "listeners": listeners,
            "clusters": [{"name": "stunner/echo", "type": "STATIC", "endpoints": list(endpoints)}],
        }


def write_cert(tmp: Path, gateway: Gateway) -> Path:
    path = tmp / "cert.pem"
    path.write_bytes(base64.b64decode(gateway.cert))
    return path


UCLIENT_MESSAGES = 50
UCLIENT_SESSIONS = 2
UCLIENT_TRANSPORT = {
    "TURN-UDP": [],
    "TURN-TCP": ["-t"],
    "TURN-TLS": ["-t", "-S"],
    "TURN-DTLS": ["-S"],
}


async def uclient_every_transport(
    ports: dict[str, int], peer_port: int, auth_args: list[str]
) -> dict[str, tuple[int, int, str]]:
    """coturn's turnutils_uclient over each transport at once: (sent, received, output)."""
    binary = which("turnutils_uclient")
    if binary is None:
        pytest.skip("turnutils_uclient (coturn) is not installed")

    async def one(proto: str) -> tuple[int, int, str]:
        argv = [
            binary, *UCLIENT_TRANSPORT[proto], "-p", str(ports[proto]),
            "-e", LOOPBACK, "-r", str(peer_port), "-c", "-X",
            "-m", str(UCLIENT_SESSIONS), "-n", str(UCLIENT_MESSAGES), "-z", "2", "-l", "100",
            *auth_args, LOOPBACK,
        ]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            async with asyncio.timeout(60):
                out = (await proc.communicate())[0].decode(errors="replace")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$", out, re.M)
        sent, received = map(int, totals[-1]) if totals else (0, 0)
        return sent, received, out

    results = await asyncio.gather(*(one(p) for p in ports))
    return dict(zip(ports, results, strict=True))


def upstream_bin() -> Path:
    """The folder with upstream stunnerd, turncat and stunnerctl (skip, or fail under CI)."""
    try:
        return gobin.upstream_stunner()
    except (gobin.GoBuildError, OSError, subprocess.SubprocessError) as exc:
        reason = f"upstream STUNner {gobin.UPSTREAM_STUNNER_VERSION} could not be built: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI must run these tests)")
        pytest.skip(reason)


def stunnerctl(
    binary_dir: Path, *args: str, timeout_s: float = STEP_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run upstream stunnerctl to completion, never near a real cluster (no kubeconfig)."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["KUBECONFIG"] = os.devnull
    return subprocess.run(
        [str(binary_dir / "stunnerctl"), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def cds_flags(cds: CdsServer) -> list[str]:
    """Upstream's way of naming a CDS: host and port in two flags."""
    return ["--cds-server-address", LOOPBACK, "--cds-server-port", str(cds.port)]


async def upstream_turncat(
    binary_dir: Path, *args: str, env: Mapping[str, str] | None = None
) -> Turncat:
    """Start upstream turncat and wait for its "Client listening on" line."""
    argv = [str(binary_dir / "turncat"), "-l", "all:INFO", *args]
    tc = await start_logged(
        argv, "Client listening on", env={"KUBECONFIG": os.devnull, **(env or {})}
    )
    try:
        await tc.wait_listening()
    except BaseException:
        await tc.aclose()
        raise
    return tc


HEALTH_CHECK_RACE = "internal/object.(*Admin).reconcileHealthCheck.func1"
"""Where upstream stunnerd v1.2.1 panics now and then when its first config moves the health
check off its default ``:8086``: the reconcile closes the default server and sets it to nil
before the goroutine that serves it has started (``internal/object/admin.go``, a nil
``*http.Server`` in ``Serve``). docs/upstream-differences.md ("Upstream bugs our tests meet")."""


class UpstreamStunnerd:
    """Upstream stunnerd as a process; ``/status`` on the health port the config names."""

    def __init__(
        self,
        binary_dir: Path,
        workdir: Path,
        *args: str,
        health_port: int,
        env: Mapping[str, str] | None = None,
        name: str = "upstream-stunnerd",
    ) -> None:
        self.health_port = health_port
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("STUNNER_")}
        full_env.update(env or {})
        full_env["KUBECONFIG"] = os.devnull
        self._argv = [str(binary_dir / "stunnerd"), *args]
        self._env = full_env
        self._log_path = workdir / f"{name}.log"
        self.restarts = 0
        self.proc = ServerProcess(self._argv, env=self._env, log_path=self._log_path)
        self._http = httpx.AsyncClient(timeout=2.0)

    def _alive_or_restarted(self) -> bool:
        """Whether the process runs; once, one that died of upstream's health-check race is
        started again (see HEALTH_CHECK_RACE)."""
        if self.proc.alive():
            return True
        if self.restarts == 0 and HEALTH_CHECK_RACE in self.proc.output():
            self.restarts += 1
            self._log_path = self._log_path.with_suffix(".restarted.log")
            self.proc = ServerProcess(self._argv, env=self._env, log_path=self._log_path)
            return True
        return False

    async def status(self) -> dict[str, Any]:
        reply = await self._http.get(f"http://{LOOPBACK}:{self.health_port}/status")
        reply.raise_for_status()
        return dict(reply.json())

    async def wait_status(self, check: Any, what: str) -> dict[str, Any]:
        last: dict[str, Any] = {}
        async with asyncio.timeout(STEP_TIMEOUT_S):
            while True:
                if not self._alive_or_restarted():
                    raise AssertionError(f"upstream stunnerd exited:\n{self.log()}")
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    last = await self.status()
                    if check(last):
                        return last
                await asyncio.sleep(POLL_S)
        raise AssertionError(f"no {what}; last status {last}\n{self.log()}")  # pragma: no cover

    async def wait_log(self, text: str, count: int = 1) -> None:
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S):
                while self.proc.output().count(text) < count:
                    if not self._alive_or_restarted():
                        raise AssertionError(f"upstream stunnerd exited:\n{self.log()}")
                    await asyncio.sleep(POLL_S)
        except TimeoutError:
            raise AssertionError(
                f"upstream stunnerd never logged {text!r}:\n{self.log()}"
            ) from None

    def log(self) -> str:
        return self.proc.output()[-4000:]

    async def close(self) -> None:
        await self._http.aclose()
        # SIGTERM drains until the last allocation ends; the tests end theirs, SIGKILL after 5 s.
        self.proc.stop()


@dataclass
class OurCds:
    """A real redis-server, our ``stunner-cds`` process reading it, and the operator's writer."""

    redis: RedisServer
    cds: CdsServer
    publisher: ConfigPublisher
    client: aioredis.Redis

    @property
    def ws_origin(self) -> str:
        return f"ws://{LOOPBACK}:{self.cds.port}"

    @property
    def http_origin(self) -> str:
        return f"http://{LOOPBACK}:{self.cds.port}"

    async def publish(self, config: Mapping[str, Any]) -> None:
        """Store a config as the operator would and wait until the CDS serves exactly it."""
        config_id = config["admin"]["name"]
        await self.publisher.upsert(config_id, copy.deepcopy(dict(config)))
        await self.wait_served(config_id, lambda body: body is not None and _same(body, config))

    async def delete(self, config_id: str) -> None:
        await self.publisher.delete(config_id)
        await self.wait_served(config_id, lambda body: body is None)

    async def wait_served(self, config_id: str, check: Any) -> None:
        url = f"{self.http_origin}/api/v1/configs/{config_id}"
        async with httpx.AsyncClient(timeout=2.0) as http, asyncio.timeout(STEP_TIMEOUT_S):
            while True:
                reply = await http.get(url)
                body = reply.json() if reply.status_code == 200 else None
                if check(body):
                    return
                await asyncio.sleep(POLL_S)


def _same(served: Mapping[str, Any], published: Mapping[str, Any]) -> bool:
    """Whether the CDS serves what was published (as Go would encode it)."""
    return dict(served) == json.loads(encode_v1_config(published))


@contextlib.asynccontextmanager
async def our_cds(workdir: Path) -> AsyncIterator[OurCds]:
    redis = RedisServer(workdir)
    redis.start()
    cds = CdsServer(redis.url, workdir)
    client = aioredis.from_url(redis.url)
    try:
        cds.start()
        yield OurCds(redis, cds, ConfigPublisher(client), client)
    finally:
        await client.aclose()
        cds.stop()
        redis.stop()


@contextlib.contextmanager
def stopped(proc: ServerProcess) -> Iterator[None]:
    try:
        yield
    finally:
        proc.stop()
