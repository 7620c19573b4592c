"""The CDS across failures: Redis killed or emptied, the stream trimmed, the CDS restarted, and
several replicas on one Redis. No change may be lost or duplicated, and watchers reconverge."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from stunner_cds.store.feed import FeedOptions, RedisFeed, redis_client
from stunner_cds.store.hub import Hub, Mode, Topic
from stunner_common.cds import (
    CDS_V2_SUBPROTOCOL,
    ConfigChange,
    DeltaState,
    encode_v1_delete,
    parse_envelope,
)
from stunner_common.config import parse_config
from stunner_common.contracts.redis_keys import EVENTS_STREAM
from stunner_common.io.cds import watch_configs
from stunner_common.io.store import ConfigPublisher, PublishResult
from support.cds import (
    RunningCds,
    config,
    eventually,
    http_get,
    recv_json,
    recv_text,
    running_cds,
    wait_rev,
)
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration


async def retrying(action: Any, attempts: int = 50) -> PublishResult:
    """Run a publisher call, retrying while Redis is coming back (bounded)."""
    for _ in range(attempts - 1):
        try:
            result: PublishResult = await action()
            return result
        except (RedisConnectionError, OSError):
            await asyncio.sleep(0.05)
    result = await action()
    return result


def realm_config(config_id: str, realm: str) -> Any:
    return parse_config(config(config_id, realm))


@contextlib.asynccontextmanager
async def collecting(ws: ClientConnection) -> AsyncIterator[asyncio.Queue[str]]:
    """Read every frame of ``ws`` into a queue from an owned task."""
    frames: asyncio.Queue[str] = asyncio.Queue()

    async def pump() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for frame in ws:
                assert isinstance(frame, str)
                frames.put_nowait(frame)

    task = asyncio.create_task(pump(), name="test-collect-frames")
    try:
        yield frames
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def take(frames: asyncio.Queue[str], count: int, timeout_s: float = 15.0) -> list[str]:
    async with asyncio.timeout(timeout_s):
        return [await frames.get() for _ in range(count)]


async def test_redis_killed_and_restarted_mid_stream_loses_and_duplicates_nothing(
    no_leaked_tasks: None, redis: RedisServer, store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    await publisher.upsert("ns/gw", realm_config("ns/gw", "r-0"))
    # every change counts here, so v1 frames are not held back (CDS_V1_MIN_INTERVAL_S)
    async with running_cds(
        redis.url, reconnect_min_s=0.02, reconnect_max_s=0.2, v1_min_interval_s=0
    ) as cds:
        url = f"{cds.ws_url}/api/v1/configs/ns/gw?watch=true"
        async with (
            connect(url) as v1,
            connect(url, subprotocols=[CDS_V2_SUBPROTOCOL]) as v2,  # type: ignore[list-item]
            collecting(v1) as v1_frames,
            collecting(v2) as v2_frames,
        ):
            await take(v1_frames, 1)
            await take(v2_frames, 1)
            for i in range(1, 21):
                await publisher.upsert("ns/gw", realm_config("ns/gw", f"r-{i}"))
            await asyncio.to_thread(redis.restart, kill=True)
            for i in range(21, 41):
                await retrying(
                    lambda i=i: publisher.upsert("ns/gw", realm_config("ns/gw", f"r-{i}"))
                )
            frames = await take(v1_frames, 40)
            assert [json.loads(f)["auth"]["realm"] for f in frames] == [
                f"r-{i}" for i in range(1, 41)
            ]
            envelopes = [parse_envelope(f) for f in await take(v2_frames, 40)]
            assert [e.rev for e in envelopes] == list(range(2, 42))
            # Nothing extra is queued behind them: the next frame is the next change.
            await publisher.upsert("ns/gw", realm_config("ns/gw", "marker"))
            assert json.loads((await take(v1_frames, 1))[0])["auth"]["realm"] == "marker"
            assert parse_envelope((await take(v2_frames, 1))[0]).rev == 42


async def test_redis_that_comes_back_empty_makes_watchers_drop_what_is_gone(
    no_leaked_tasks: None, redis: RedisServer, store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    for config_id in ("ns/a", "ns/b"):
        await publisher.upsert(config_id, realm_config(config_id, "old"))
    async with (
        running_cds(redis.url, reconnect_min_s=0.02, reconnect_max_s=0.2) as cds,
        connect(f"{cds.ws_url}/api/v1/configs/ns?watch=true") as ws,
    ):
        assert sorted([(await recv_json(ws))["admin"]["name"] for _ in range(2)]) == [
            "ns/a",
            "ns/b",
        ]
        await asyncio.to_thread(redis.stop, kill=True)
        for leftover in redis.workdir.glob("appendonly*"):
            if leftover.is_dir():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
        await asyncio.to_thread(redis.start)
        deletes = sorted([await recv_text(ws), await recv_text(ws)])
        assert deletes == sorted([encode_v1_delete("ns/a"), encode_v1_delete("ns/b")])
        # The operator re-publishes: the watcher converges on the new state.
        await retrying(lambda: publisher.upsert("ns/a", realm_config("ns/a", "new")))
        again = await recv_json(ws)
        assert again["admin"]["name"] == "ns/a"
        assert again["auth"]["realm"] == "new"


async def test_a_stream_trimmed_past_the_cds_reloads_and_sends_only_differences(
    no_leaked_tasks: None, redis: RedisServer, store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    for config_id in ("ns/a", "ns/b", "ns/c"):
        await publisher.upsert(config_id, realm_config(config_id, "r0"))
    hub = Hub()
    client = redis_client(redis.url, timeout_s=2, block_ms=50)
    feed = RedisFeed(client, hub, FeedOptions(block_ms=50))
    feed.start()
    try:
        async with asyncio.timeout(5):
            await feed.synced.wait()
        watcher, _ = hub.subscribe(Topic(), Mode.V1)
        v2_watcher, _ = hub.subscribe(Topic(), Mode.V2)
        assert len(watcher.frames) == 3
        watcher.frames.clear()
        v2_watcher.frames.clear()
        # The CDS is cut off while the store moves on and the stream is trimmed behind it.
        await feed.stop()
        for i in range(1, 6):
            await publisher.upsert("ns/a", realm_config("ns/a", f"r{i}"))
        await publisher.delete("ns/b")
        await publisher.upsert("ns/d", realm_config("ns/d", "r0"))
        await store.xtrim(EVENTS_STREAM, maxlen=1, approximate=False)
        feed.start()
        await eventually(lambda: _at_rev(hub, 10), what="feed reloaded at revision 10")
        frames = sorted(watcher.frames)
        assert len(frames) == 3
        assert encode_v1_delete("ns/b") in frames
        decoded = {json.loads(f)["admin"]["name"]: json.loads(f) for f in frames}
        assert decoded["ns/a"]["auth"]["realm"] == "r5"
        assert "ns/d" in decoded
        assert "ns/c" not in decoded
        types = sorted(json.loads(f)["type"] for f in v2_watcher.frames)
        assert types == ["delete", "patch", "snapshot"]
        assert hub.mirror.rev == 10
    finally:
        await feed.stop()
        await client.aclose()


async def _at_rev(hub: Hub, rev: int) -> bool:
    return hub.mirror.rev == rev


async def test_clients_reconnect_after_a_cds_restart_and_resync(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    await publisher.upsert("ns/a", realm_config("ns/a", "r0"))
    await publisher.upsert("ns/b", realm_config("ns/b", "r0"))
    cds = await _start(redis)
    port = cds.port
    changes: asyncio.Queue[ConfigChange] = asyncio.Queue()
    state = DeltaState()

    async def v2_client() -> None:
        async for change in watch_configs(
            cds.http_url, namespace="ns", state=state, min_backoff_s=0.02, max_backoff_s=0.1
        ):
            changes.put_nowait(change)

    v2_task = asyncio.create_task(v2_client(), name="test-v2-client")
    try:
        async with asyncio.timeout(10):
            first = sorted([(await changes.get()).id, (await changes.get()).id])
        assert first == ["ns/a", "ns/b"]
        await cds.stop()
        result = await publisher.upsert("ns/a", realm_config("ns/a", "while-down"))
        cds = await _start(redis, port=port)
        await wait_rev(cds, result.rev)
        async with asyncio.timeout(10):
            resumed = await changes.get()
        assert resumed.id == "ns/a"
        assert resumed.config is not None
        assert resumed.config["auth"]["realm"] == "while-down"
        await publisher.upsert("ns/c", realm_config("ns/c", "marker"))
        async with asyncio.timeout(10):
            assert (await changes.get()).id == "ns/c"  # no replay of ns/b in between
        # An upstream v1 client simply reconnects and gets the full snapshot again.
        async with connect(f"{cds.ws_url}/api/v1/configs/ns?watch=true") as v1:
            got = sorted([(await recv_json(v1))["admin"]["name"] for _ in range(3)])
            assert got == ["ns/a", "ns/b", "ns/c"]
    finally:
        v2_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await v2_task
        await cds.stop()


async def _start(redis: RedisServer, port: int = 0) -> RunningCds:
    from support.cds import start_cds, wait_ready

    cds = await start_cds(redis.url, port=port)
    await wait_ready(cds)
    return cds


async def test_two_replicas_on_one_redis_serve_the_same_answers(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    await publisher.upsert("ns/a", realm_config("ns/a", "r0"))
    # frame for frame: no v1 frame held back on one replica and not on the other
    async with (
        running_cds(redis.url, v1_min_interval_s=0) as one,
        running_cds(redis.url, v1_min_interval_s=0) as two,
        connect(f"{one.ws_url}/api/v1/configs?watch=true") as ws_one,
        connect(f"{two.ws_url}/api/v1/configs?watch=true") as ws_two,
    ):
        assert await recv_text(ws_one) == await recv_text(ws_two)
        last = None
        for i in range(1, 6):
            last = (await publisher.upsert("ns/a", realm_config("ns/a", f"r{i}"))).rev
        last = (await publisher.upsert("ns/b", realm_config("ns/b", "r0"))).rev or last
        await wait_rev(one, last)
        await wait_rev(two, last)
        for path in ("/api/v1/configs", "/api/v1/configs/ns", "/api/v1/configs/ns/a"):
            assert (await http_get(one, path)).text == (await http_get(two, path)).text
        for _ in range(6):
            assert await recv_text(ws_one) == await recv_text(ws_two)


async def test_malformed_stream_entries_are_stepped_over(
    no_leaked_tasks: None,
    redis: RedisServer,
    store: aioredis.Redis,
    publisher: ConfigPublisher,
) -> None:
    await publisher.upsert("ns/a", realm_config("ns/a", "r0"))
    hub = Hub()
    client = redis_client(redis.url, timeout_s=2, block_ms=50)
    feed = RedisFeed(client, hub, FeedOptions(block_ms=50))
    feed.start()
    try:
        async with asyncio.timeout(5):
            await feed.synced.wait()
        watcher, _ = hub.subscribe(Topic(), Mode.V1)
        watcher.frames.clear()
        junk_id = cast(bytes, await store.xadd(EVENTS_STREAM, {"something": "else"})).decode()
        await eventually(lambda: _past(hub, junk_id), what="the feed stepped over the junk entry")
        await publisher.upsert("ns/a", realm_config("ns/a", "r1"))
        await eventually(lambda: _at_rev(hub, 2), what="the next change applied")
        assert [json.loads(f)["auth"]["realm"] for f in watcher.frames] == ["r1"]
    finally:
        await feed.stop()
        await client.aclose()


async def _past(hub: Hub, event_id: str) -> bool:
    return hub.mirror.last_event_id == event_id


async def test_a_v2_client_back_after_an_empty_redis_gets_the_new_history_whatever_its_numbers(
    no_leaked_tasks: None, redis: RedisServer, store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    for i in range(5):
        await publisher.upsert("ns/a", realm_config("ns/a", f"old-{i}"))
    async with running_cds(redis.url, reconnect_min_s=0.02, reconnect_max_s=0.2) as cds:
        url = f"{cds.ws_url}/api/v1/configs/ns/a?watch=true"
        async with connect(url, subprotocols=[CDS_V2_SUBPROTOCOL]) as ws:  # type: ignore[list-item]
            assert ws.response is not None
            old_epoch = ws.response.headers["x-stunner-epoch"]
            held = parse_envelope(await recv_text(ws))
            assert (held.rev, held.epoch) == (5, old_epoch)
            await asyncio.to_thread(redis.restart_empty)
            # The watcher is told to start over: its revisions mean nothing any more.
            with pytest.raises(ConnectionClosed) as closed:
                await recv_text(ws, timeout_s=10)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1012
            assert "config store reset" in closed.value.rcvd.reason
        revoked = await retrying(lambda: publisher.upsert("ns/a", realm_config("ns/a", "new")))
        assert revoked.changes == {"ns/a": 1}
        assert revoked.epoch != old_epoch
        for i in range(6):  # the new numbering passes the revision the client holds
            last = await publisher.upsert("ns/other", realm_config("ns/other", f"r{i}"))
        await wait_rev(cds, last.rev)
        # The client comes back with what it holds: revision 5 of the old history.
        async with connect(
            f"{url}&since=5&epoch={old_epoch}",
            subprotocols=[CDS_V2_SUBPROTOCOL],  # type: ignore[list-item]
        ) as ws:
            assert ws.response is not None
            assert ws.response.headers["x-stunner-resync"] == "full"
            assert ws.response.headers["x-stunner-epoch"] == revoked.epoch
            snapshot = parse_envelope(await recv_text(ws))
            assert snapshot.type == "snapshot"
            assert (snapshot.rev, snapshot.epoch) == (1, revoked.epoch)
            assert snapshot.config["auth"]["realm"] == "new"
        # A resume in the new history is honoured.
        async with connect(
            f"{url}&since=1&epoch={revoked.epoch}",
            subprotocols=[CDS_V2_SUBPROTOCOL],  # type: ignore[list-item]
        ) as ws:
            assert ws.response is not None
            assert ws.response.headers["x-stunner-resync"] == "delta"


async def test_a_store_flushed_under_a_live_cds_is_noticed_without_a_reconnect(
    no_leaked_tasks: None, redis: RedisServer, store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    for i in range(4):
        await publisher.upsert("ns/a", realm_config("ns/a", f"old-{i}"))
    async with running_cds(redis.url) as cds:
        url = f"{cds.ws_url}/api/v1/configs/ns?watch=true"
        async with (
            connect(url) as v1,
            connect(url, subprotocols=[CDS_V2_SUBPROTOCOL]) as v2,  # type: ignore[list-item]
            collecting(v1) as v1_frames,
            collecting(v2) as v2_frames,
        ):
            await take(v1_frames, 1)
            await take(v2_frames, 1)
            await store.flushall()
            await publisher.upsert("ns/a", realm_config("ns/a", "after-flush"))
            got = json.loads((await take(v1_frames, 1))[0])
            assert got["auth"]["realm"] == "after-flush"
            await eventually(lambda: _closed(v2), what="the v2 watcher closed for a resync")
            assert v2_frames.empty()
        assert (await http_get(cds, "/healthz")).json()["epoch"] == (
            await publisher.upsert("ns/a", realm_config("ns/a", "after-flush"))
        ).epoch
        metrics = (await http_get(cds, "/metrics")).text
        assert "stunner_cds_store_resets_total 1.0" in metrics
        assert 'stunner_cds_watchers_dropped_total{reason="store_reset"} 1.0' in metrics


async def _closed(ws: ClientConnection) -> bool:
    return ws.close_code is not None
