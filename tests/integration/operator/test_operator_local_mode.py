"""Local mode end to end: a folder of YAML, the operator, a real redis-server.

Edits to the folder reach Redis (the ``stunner:configs`` hash and the ``stunner:events`` stream);
a broken file is reported with its location and leaves the published configs untouched; Redis
being away at start only delays publishing. Waits are bounded by ``asyncio.timeout`` and wait on
Redis stream entries or log records, never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from stunner_common.contracts.redis_keys import CONFIGS_HASH, EVENTS_STREAM
from stunner_operator.manifests.local import LocalOperator, LocalOptions
from stunner_operator.publish import RedisConfigSink
from support.processes import ServerProcess
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "local"
BIN = Path(sys.executable).parent
DEADLINE_S = 5.0  # a bound against hangs; the operator reacts in well under a second
STARTUP_S = 60  # a bound on starting the operator's process (seconds on a loaded machine)


class LogQueue(logging.Handler):
    """Log records of the operator, as an asyncio queue a test can await."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.queue: asyncio.Queue[logging.LogRecord] = asyncio.Queue()

    def emit(self, record: logging.LogRecord) -> None:
        self.queue.put_nowait(record)

    async def wait_for(self, level: int, text: str) -> logging.LogRecord:
        async with asyncio.timeout(DEADLINE_S):
            while True:
                record = await self.queue.get()
                if record.levelno == level and text in record.getMessage():
                    return record


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    dest = tmp_path / "manifests"
    shutil.copytree(EXAMPLE, dest)
    return dest


@pytest.fixture
def logs() -> Iterator[LogQueue]:
    handler = LogQueue()
    logger = logging.getLogger("stunner_operator")
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@pytest.fixture
async def client(redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(redis.url, decode_responses=True)
    try:
        yield conn
    finally:
        await conn.aclose()


async def next_event(client: aioredis.Redis, last_id: str) -> tuple[str, dict[str, str]]:
    async with asyncio.timeout(DEADLINE_S):
        while True:
            got: Any = await client.xread({EVENTS_STREAM: last_id}, block=500, count=1)
            if got:
                ((_stream, entries),) = got
                entry_id, fields = entries[0]
                return entry_id, fields


async def configs(client: aioredis.Redis) -> dict[str, dict[str, object]]:
    raw: dict[str, str] = cast(Any, await client.hgetall(CONFIGS_HASH))
    return {k: json.loads(v) for k, v in raw.items()}


QUICK = LocalOptions(debounce_ms=20)


async def start(
    folder: Path, redis_url: str, options: LocalOptions = QUICK
) -> tuple[asyncio.Task[None], asyncio.Event, RedisConfigSink]:
    sink = RedisConfigSink(redis_url, timeout_s=1.0)
    operator = LocalOperator(folder, sink, options)
    stop = asyncio.Event()
    task = asyncio.create_task(operator.run(stop), name="local-operator")
    return task, stop, sink


async def finish(task: asyncio.Task[None], stop: asyncio.Event, sink: RedisConfigSink) -> None:
    stop.set()
    async with asyncio.timeout(DEADLINE_S):
        await task
    await sink.aclose()


async def test_local_mode_publishes_the_folder_and_follows_edits(
    no_leaked_tasks: None, redis: RedisServer, client: aioredis.Redis, folder: Path
) -> None:
    task, stop, sink = await start(folder, redis.url)
    try:
        last = "0-0"
        seen: set[str] = set()
        while seen != {"stunner/udp-gateway", "stunner/tcp-gateway"}:
            last, fields = await next_event(client, last)
            seen.add(fields["id"])
        stored = await configs(client)
        assert stored["stunner/udp-gateway"]["auth"]["credentials"] == {  # type: ignore[index]
            "username": "user-1",
            "password": "pass-1",
        }
        udp = stored["stunner/udp-gateway"]["listeners"][0]  # type: ignore[index]
        assert (udp["protocol"], udp["port"], udp["public_address"]) == (
            "TURN-UDP",
            3478,
            "127.0.0.1",
        )

        # An edit reaches Redis: both Gateways share the GatewayConfig.
        cfg = folder / "gatewayconfig.yaml"
        cfg.write_text(cfg.read_text().replace("pass-1", "pass-2"))
        changed: set[str] = set()
        while changed != {"stunner/udp-gateway", "stunner/tcp-gateway"}:
            last, fields = await next_event(client, last)
            assert fields["op"] == "upsert"
            changed.add(fields["id"])
        stored = await configs(client)
        assert stored["stunner/tcp-gateway"]["auth"]["credentials"]["password"] == "pass-2"  # type: ignore[index]

        # Deleting a Gateway deletes its config.
        gws = folder / "gateways.yaml"
        gws.write_text(gws.read_text().split("---")[0])
        last, fields = await next_event(client, last)
        assert (fields["op"], fields["id"]) == ("delete", "stunner/tcp-gateway")
        assert list(await configs(client)) == ["stunner/udp-gateway"]
    finally:
        await finish(task, stop, sink)


async def test_a_broken_file_is_reported_and_changes_nothing_in_redis(
    no_leaked_tasks: None,
    redis: RedisServer,
    client: aioredis.Redis,
    folder: Path,
    logs: LogQueue,
) -> None:
    task, stop, sink = await start(folder, redis.url)
    try:
        # Configs are published in id order.
        await logs.wait_for(logging.INFO, "published config stunner/tcp-gateway")
        await logs.wait_for(logging.INFO, "published config stunner/udp-gateway")
        before = await configs(client)
        length = await client.xlen(EVENTS_STREAM)

        route = folder / "route.yaml"
        route.write_text(
            route.read_text() + "---\napiVersion: stunner.l7mp.io/v1\nkind: UDPRoute\nspec: [\n"
        )
        record = await logs.wait_for(logging.ERROR, "route.yaml")
        assert "invalid YAML" in record.getMessage()

        gws = folder / "gateways.yaml"
        gws.write_text(gws.read_text().replace("port: 3479", "port: 0"))
        record = await logs.wait_for(logging.ERROR, "gateways.yaml document 1")
        assert "spec.listeners.0.port" in record.getMessage()

        assert await configs(client) == before
        assert await client.xlen(EVENTS_STREAM) == length

        # Fixing the file brings the change through.
        gws.write_text(gws.read_text().replace("port: 0", "port: 3480"))
        await logs.wait_for(logging.INFO, "published config stunner/tcp-gateway")
        tcp = (await configs(client))["stunner/tcp-gateway"]["listeners"][0]  # type: ignore[index]
        assert tcp["port"] == 3480
    finally:
        await finish(task, stop, sink)


async def test_configs_are_published_once_redis_comes_up(
    no_leaked_tasks: None, redis: RedisServer, folder: Path, logs: LogQueue
) -> None:
    redis.stop()
    task, stop, sink = await start(folder, redis.url, replace(QUICK, retry_s=0.05))
    try:
        await logs.wait_for(logging.WARNING, "publishing to Redis failed")
        redis.start()
        await logs.wait_for(logging.INFO, "published config stunner/udp-gateway")
        conn = aioredis.Redis.from_url(redis.url, decode_responses=True)
        try:
            assert sorted(await conn.hkeys(CONFIGS_HASH)) == [
                "stunner/tcp-gateway",
                "stunner/udp-gateway",
            ]
        finally:
            await conn.aclose()
    finally:
        await finish(task, stop, sink)


async def test_stale_configs_in_redis_are_removed_at_start(
    no_leaked_tasks: None, redis: RedisServer, client: aioredis.Redis, folder: Path, logs: LogQueue
) -> None:
    await client.hset(CONFIGS_HASH, "old/gone", "{}")
    task, stop, sink = await start(folder, redis.url)
    try:
        await logs.wait_for(logging.INFO, "deleted config old/gone")
        assert sorted(await client.hkeys(CONFIGS_HASH)) == [
            "stunner/tcp-gateway",
            "stunner/udp-gateway",
        ]
    finally:
        await finish(task, stop, sink)


def test_the_command_renders_the_example_folder_with_print() -> None:
    out = subprocess.run(
        [str(BIN / "stunner-operator"), "--manifests", str(EXAMPLE), "--print"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    ids = [json.loads(line)["admin"]["name"] for line in out.stdout.splitlines()]
    assert ids == ["stunner/tcp-gateway", "stunner/udp-gateway"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot load kubeconfig"),
        (["--print"], "--print needs --manifests PATH"),
        (["--manifests", "/nonexistent/folder"], "no such file or folder"),
    ],
)
def test_the_command_refuses_what_it_cannot_do(args: list[str], message: str) -> None:
    out = subprocess.run(
        [str(BIN / "stunner-operator"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert message in out.stderr


async def test_the_command_runs_local_mode_and_stops_on_sigterm(
    redis: RedisServer, client: aioredis.Redis, folder: Path, tmp_path: Path
) -> None:
    proc = ServerProcess(
        [
            str(BIN / "stunner-operator"),
            "--manifests",
            str(folder),
            "--redis-url",
            redis.url,
            "--health-address",
            "127.0.0.1:0",
            "--metrics-address",
            "127.0.0.1:0",
        ],
        log_path=tmp_path / "operator.log",
    )
    try:
        # Starting a Python process is not the operator's reaction time: on a loaded machine it
        # takes seconds, so wait for the process to be up before the per-event deadline runs.
        for _ in range(STARTUP_S * 10):
            if "local mode: watching" in proc.output() or not proc.alive():
                break
            await asyncio.sleep(0.1)
        assert proc.alive(), proc.output()
        last = "0-0"
        seen: set[str] = set()
        while seen != {"stunner/udp-gateway", "stunner/tcp-gateway"}:
            last, fields = await next_event(client, last)
            seen.add(fields["id"])
    finally:
        code = proc.stop(signal.SIGTERM)
    assert code == 0, proc.output()
    assert "Gateway stunner/udp-gateway: Accepted, Programmed" in proc.output()
