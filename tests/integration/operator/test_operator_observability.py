"""The operator's /healthz, /readyz and /metrics, in local mode against a real Redis, in
Kubernetes mode against kmock, and for a standby replica; plus the CLI's one-line refusals."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from stunner_common.io.kube.api import KubeApi
from stunner_operator.controller.leader import LeaderElector, LeaderOptions
from stunner_operator.manifests.local import LocalOperator, LocalOptions
from stunner_operator.observe import ObservabilityServer, OperatorMetrics, parse_address
from stunner_operator.publish import RedisConfigSink
from support.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DEADLINE_S = 20.0
BASE = Path(__file__).resolve().parents[2] / "fixtures" / "operator" / "seeds" / "base.yaml"
"""The seed examples' base objects: one GatewayClass and one Gateway (stunner/udp-gateway)."""


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def get(
    http: aiohttp.ClientSession, server: ObservabilityServer, path: str
) -> tuple[int, str]:
    target = server.prometheus if path == "/metrics" else server.health
    assert target is not None
    async with http.get(f"http://127.0.0.1:{target.bound_port}{path}") as resp:
        return resp.status, await resp.text()


async def until_status(
    http: aiohttp.ClientSession, server: ObservabilityServer, path: str, status: int
) -> str:
    async with asyncio.timeout(DEADLINE_S):
        while True:
            code, body = await get(http, server, path)
            if code == status:
                return body
            await asyncio.sleep(0.05)


def sample(metrics_text: str, name: str) -> float | None:
    for line in metrics_text.splitlines():
        if line.startswith(name + " ") or (line.startswith(name + "{") and " " in line):
            head, value = line.rsplit(" ", 1)
            if head == name:
                return float(value)
    return None


def served(metrics: OperatorMetrics) -> ObservabilityServer:
    return ObservabilityServer(
        metrics, health_address=("127.0.0.1", 0), metrics_address=("127.0.0.1", 0)
    )


async def run_local(
    folder: Path, sink: RedisConfigSink, metrics: OperatorMetrics
) -> tuple[asyncio.Task[None], asyncio.Event]:
    operator = LocalOperator(folder, sink, LocalOptions(retry_s=0.05), metrics=metrics)
    stop = asyncio.Event()
    return asyncio.create_task(operator.run(stop)), stop


async def test_local_mode_is_ready_once_published_and_counts_what_it_did(
    no_leaked_tasks: None, redis: RedisServer, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    (tmp_path / "all.yaml").write_text(BASE.read_text())
    metrics = OperatorMetrics()
    server = served(metrics)
    await server.start()
    sink = RedisConfigSink(redis.url, timeout_s=2)
    try:
        code, body = await get(http, server, "/readyz")
        assert code == 503
        assert "first render" in body
        assert (await get(http, server, "/healthz"))[0] == 200
        task, stop = await run_local(tmp_path, sink, metrics)
        try:
            await until_status(http, server, "/readyz", 200)
            code, text = await get(http, server, "/metrics")
            assert code == 200
            # The folder watcher may report the file once more: a second (empty) render.
            assert (sample(text, "stunner_operator_renders_total") or 0) >= 1
            assert sample(text, "stunner_operator_configs") == 1
            assert sample(text, "stunner_operator_publishes_total") == 1
            assert sample(text, "stunner_operator_publish_errors_total") == 0
            assert sample(text, "stunner_operator_ready") == 1
            assert 'stunner_operator_objects{kind="Gateway"} 1.0' in text
            assert 'stunner_operator_objects{kind="GatewayClass"} 1.0' in text
            assert "stunner_operator_render_duration_seconds_count" in text
            assert (await get(http, server, "/nope"))[0] == 404
        finally:
            stop.set()
            await task
    finally:
        await sink.aclose()
        await server.close()


async def test_local_mode_is_not_ready_while_redis_is_unreachable(
    no_leaked_tasks: None, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    from support.ports import free_port

    (tmp_path / "all.yaml").write_text(BASE.read_text())
    metrics = OperatorMetrics()
    server = served(metrics)
    await server.start()
    sink = RedisConfigSink(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    task, stop = await run_local(tmp_path, sink, metrics)
    try:
        for _ in range(int(DEADLINE_S / 0.05)):
            if "publishing the first render failed" in metrics.why_not_ready:
                break
            await asyncio.sleep(0.05)
        code, body = await get(http, server, "/readyz")
        assert code == 503
        assert "publishing the first render failed" in body
        _, text = await get(http, server, "/metrics")
        assert (sample(text, "stunner_operator_publish_errors_total") or 0) >= 1
        assert sample(text, "stunner_operator_ready") == 0
    finally:
        stop.set()
        await task
        await sink.aclose()
        await server.close()


def elector(api: KubeApi, identity: str, metrics: OperatorMetrics | None = None) -> LeaderElector:
    options = LeaderOptions(
        namespace="stunner", name="op", identity=identity, lease_duration_s=5, renew_period_s=0.1
    )
    return LeaderElector(api, options, metrics=metrics)


async def test_a_standby_replica_is_ready_and_not_leader(
    no_leaked_tasks: None, api: KubeApi, http: aiohttp.ClientSession
) -> None:
    assert await elector(api, "a")._try_acquire()
    metrics = OperatorMetrics()
    server = served(metrics)
    await server.start()
    standby = elector(api, "b", metrics)
    led = asyncio.Event()

    async def lead(lost: asyncio.Event) -> None:
        led.set()

    stop = asyncio.Event()
    task = asyncio.create_task(standby.run(lead, stop))
    try:
        await until_status(http, server, "/readyz", 200)
        _, text = await get(http, server, "/metrics")
        assert sample(text, "stunner_operator_leader") == 0
        assert not led.is_set()
    finally:
        stop.set()
        await task
        await server.close()


async def test_a_new_leader_is_not_ready_until_it_has_published(
    no_leaked_tasks: None, api: KubeApi, http: aiohttp.ClientSession
) -> None:
    metrics = OperatorMetrics()
    server = served(metrics)
    await server.start()
    candidate = elector(api, "a", metrics)
    leading = asyncio.Event()
    publish = asyncio.Event()

    async def lead(lost: asyncio.Event) -> None:
        leading.set()
        await publish.wait()
        metrics.mark_published()
        await lost.wait()

    stop = asyncio.Event()
    task = asyncio.create_task(candidate.run(lead, stop))
    try:
        async with asyncio.timeout(DEADLINE_S):
            await leading.wait()
        code, body = await get(http, server, "/readyz")
        assert code == 503
        assert "leading" in body
        _, text = await get(http, server, "/metrics")
        assert sample(text, "stunner_operator_leader") == 1
        publish.set()
        await until_status(http, server, "/readyz", 200)
    finally:
        stop.set()
        await task
        await server.close()


@pytest.mark.parametrize(
    ("text", "parsed"),
    [(":8081", ("0.0.0.0", 8081)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:80", ("::1", 80))],
)
def test_parse_address(text: str, parsed: tuple[str, int]) -> None:
    assert parse_address(text, "--x") == parsed


@pytest.mark.parametrize("text", ["8081", "host:", "host:99999", "host:http"])
def test_parse_address_refuses_junk(text: str) -> None:
    with pytest.raises(ValueError, match="--x"):
        parse_address(text, "--x")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stunner_operator", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_version_prints_the_package_version() -> None:
    import importlib.metadata

    out = cli("--version")
    assert (out.returncode, out.stdout) == (
        0,
        f"stunner-operator {importlib.metadata.version('stunner-operator')}\n",
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--bogus"], {}, "stunner-operator: unrecognized arguments: --bogus (see --help)"),
        (
            ["--manifests", ".", "--health-address", "nonsense"],
            {},
            "stunner-operator: --health-address: 'nonsense' is not HOST:PORT",
        ),
        (
            ["--manifests", "."],
            {"REDIS_URL": "redis://127.0.0.1:1/0", "OPERATOR_REDIS_STARTUP_TIMEOUT_S": "0.2"},
            "stunner-operator: cannot reach Redis at redis://127.0.0.1:1/0",
        ),
        (
            ["--manifests", "."],
            {"REDIS_URL": "http://example/"},
            "stunner-operator: invalid Redis URL 'http://example/'",
        ),
        (
            ["--kubeconfig", "/nonexistent/kubeconfig"],
            {},
            "stunner-operator: cannot load kubeconfig /nonexistent/kubeconfig",
        ),
        (
            ["--manifests", "."],
            {"OPERATOR_LEASE_DURATION_S": "zero"},
            "stunner-operator: invalid settings: lease_duration_s:",
        ),
    ],
)
def test_the_cli_refuses_in_one_line_with_exit_2(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    out = cli(*args, "--metrics-address", "", env=env)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(message), out.stderr
    assert "Traceback" not in out.stderr
