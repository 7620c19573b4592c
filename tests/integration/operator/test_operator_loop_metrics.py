"""Per control loop: events handled, their duration, and the "active loops" gauge that a hung
loop leaves raised (upstream operator v1.2's loop metrics, stunner-gateway-operator #71)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from stunner_operator.manifests.local import LocalOperator, LocalOptions
from stunner_operator.observe import ObservabilityServer, OperatorMetrics
from stunner_operator.publish import RedisConfigSink
from support.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DEADLINE_S = 20.0
BASE = Path(__file__).resolve().parents[2] / "fixtures" / "operator" / "seeds" / "base.yaml"


def sample(text: str, series: str) -> float | None:
    """The value of one exact series line (name with labels) of a Prometheus exposition."""
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == series:
            return float(value)
    return None


async def scrape(http: aiohttp.ClientSession, server: ObservabilityServer) -> str:
    assert server.prometheus is not None
    async with http.get(f"http://127.0.0.1:{server.prometheus.bound_port}/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


async def until_metric(
    http: aiohttp.ClientSession, server: ObservabilityServer, series: str, value: float
) -> str:
    async with asyncio.timeout(DEADLINE_S):
        while True:
            text = await scrape(http, server)
            if sample(text, series) == value:
                return text
            await asyncio.sleep(0.05)


@pytest.fixture
async def served() -> AsyncIterator[tuple[OperatorMetrics, ObservabilityServer]]:
    metrics = OperatorMetrics()
    server = ObservabilityServer(metrics, health_address=None, metrics_address=("127.0.0.1", 0))
    await server.start()
    yield metrics, server
    await server.close()


@pytest.fixture
async def silent_redis() -> AsyncIterator[str]:
    """A TCP server that takes connections and never answers: a Redis that hangs."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"redis://127.0.0.1:{port}/0"
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_each_loop_counts_and_times_its_events_and_is_idle_after(
    redis: RedisServer, tmp_path: Path, served: tuple[OperatorMetrics, ObservabilityServer]
) -> None:
    metrics, server = served
    (tmp_path / "all.yaml").write_text(BASE.read_text())
    sink = RedisConfigSink(redis.url, timeout_s=2)
    operator = LocalOperator(tmp_path, sink, LocalOptions(retry_s=0.05), metrics=metrics)
    stop = asyncio.Event()
    task = asyncio.create_task(operator.run(stop))
    try:
        async with aiohttp.ClientSession() as http:
            text = await until_metric(
                http, server, 'stunner_operator_loop_events_total{loop="publish"}', 1.0
            )
            for loop in ("render", "publish"):
                assert (
                    sample(text, f'stunner_operator_loop_events_total{{loop="{loop}"}}') or 0
                ) >= 1
                assert sample(text, f'stunner_operator_active_loops{{loop="{loop}"}}') == 0
                count = f'stunner_operator_loop_duration_seconds_count{{loop="{loop}"}}'
                assert (sample(text, count) or 0) >= 1
                stamp = f'stunner_operator_loop_last_active_timestamp_seconds{{loop="{loop}"}}'
                assert (sample(text, stamp) or 0) > 1.7e9
    finally:
        stop.set()
        await task
        await sink.aclose()


async def test_a_hung_publish_leaves_its_active_loop_gauge_raised(
    silent_redis: str, tmp_path: Path, served: tuple[OperatorMetrics, ObservabilityServer]
) -> None:
    metrics, server = served
    (tmp_path / "all.yaml").write_text(BASE.read_text())
    sink = RedisConfigSink(silent_redis, timeout_s=50)
    operator = LocalOperator(tmp_path, sink, LocalOptions(retry_s=0.05), metrics=metrics)
    task = asyncio.create_task(operator.run(asyncio.Event()))
    try:
        async with aiohttp.ClientSession() as http:
            text = await until_metric(
                http, server, 'stunner_operator_active_loops{loop="publish"}', 1.0
            )
            assert sample(text, 'stunner_operator_active_loops{loop="render"}') == 0
            assert sample(text, 'stunner_operator_loop_events_total{loop="publish"}') is None
            assert (sample(text, 'stunner_operator_loop_events_total{loop="render"}') or 0) >= 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await sink.aclose()
    # cancelled at last: the loop is no longer active
    gauge = metrics.registry.get_sample_value("stunner_operator_active_loops", {"loop": "publish"})
    assert gauge == 0
