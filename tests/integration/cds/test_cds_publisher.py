"""The Redis publisher writes the store's layout (stunner_common.io.store) atomically and only
when a config changed."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from stunner_common.config import parse_config
from stunner_common.contracts.redis_keys import (
    CONFIGS_HASH,
    EPOCH_FIELD,
    EVENTS_STREAM,
    META_HASH,
    REV_COUNTER,
    REVS_HASH,
)
from stunner_common.io.store import (
    ConfigPublisher,
    ConfigReader,
    InvalidConfigIdError,
    StoreError,
)
from support.cds import config

pytestmark = pytest.mark.integration


async def stream(store: aioredis.Redis) -> list[dict[str, str]]:
    entries: list[tuple[bytes, dict[bytes, bytes]]] = cast(Any, await store.xrange(EVENTS_STREAM))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


async def test_upsert_writes_hash_stream_and_counter_together(
    store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    stunner_config = parse_config(config("ns/gw"))
    result = await publisher.upsert("ns/gw", stunner_config)
    assert result.changes == {"ns/gw": 1}
    canonical = stunner_config.canonical_json()
    assert await store.hget(CONFIGS_HASH, "ns/gw") == canonical.encode()
    assert await store.get(REV_COUNTER) == b"1"
    assert await store.hget(REVS_HASH, "ns/gw") == b"1"
    epoch = result.epoch
    assert len(epoch) == 16
    assert await store.hget(META_HASH, EPOCH_FIELD) == epoch.encode()
    assert await stream(store) == [
        {"op": "upsert", "id": "ns/gw", "rev": "1", "config": canonical, "epoch": epoch}
    ]


async def test_identical_upsert_is_a_no_op(
    store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    assert (await publisher.upsert("ns/gw", parse_config(config("ns/gw")))).changed
    assert not (await publisher.upsert("ns/gw", parse_config(config("ns/gw")))).changed
    raw = config("ns/raw")
    assert (await publisher.upsert("ns/raw", json.dumps(raw))).changed
    reordered = json.dumps(dict(reversed(list(raw.items()))))
    assert not (await publisher.upsert("ns/raw", reordered)).changed
    assert await store.get(REV_COUNTER) == b"2"
    assert len(await stream(store)) == 2


async def test_delete_removes_the_config_and_records_the_revision(
    store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    await publisher.upsert("ns/gw", config("ns/gw"))
    assert (await publisher.delete("ns/gw")).changes == {"ns/gw": 2}
    assert not (await publisher.delete("ns/gw")).changed
    assert not (await publisher.delete("ns/never")).changed
    assert await store.hexists(CONFIGS_HASH, "ns/gw") is False
    assert await store.hget(REVS_HASH, "ns/gw") == b"2"
    assert (await stream(store))[-1] == {
        "op": "delete",
        "id": "ns/gw",
        "rev": "2",
        "config": "",
        "epoch": (await publisher.delete("ns/gw")).epoch,
    }


async def test_replace_all_upserts_changed_and_deletes_missing_configs(
    store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    await publisher.replace_all({"a/one": config("a/one"), "a/two": config("a/two")})
    result = await publisher.replace_all(
        {
            "a/one": config("a/one"),
            "a/two": config("a/two", realm="new"),
            "b/three": config("b/three"),
        }
    )
    assert result.changes == {"a/two": 3, "b/three": 4}
    result = await publisher.replace_all({"b/three": config("b/three")})
    assert result.changes == {"a/one": 5, "a/two": 6}
    assert set(await store.hkeys(CONFIGS_HASH)) == {b"b/three"}
    revs = [int(e["rev"]) for e in await stream(store)]
    assert revs == list(range(1, 7))
    assert not (await publisher.replace_all({"b/three": config("b/three")})).changed


@pytest.mark.parametrize("bad_id", ["", "ns", "/gw", "ns/", "a/b/c"])
async def test_ids_that_are_not_namespace_slash_name_are_refused(
    store: aioredis.Redis, publisher: ConfigPublisher, bad_id: str
) -> None:
    with pytest.raises(InvalidConfigIdError, match="namespace/name"):
        await publisher.upsert(bad_id, config("x/y"))
    with pytest.raises(InvalidConfigIdError):
        await publisher.replace_all({"ok/id": config("ok/id"), bad_id: config("x/y")})
    assert await store.exists(CONFIGS_HASH, REV_COUNTER, EVENTS_STREAM) == 0


@pytest.mark.parametrize("bad", ["not json", "[1, 2]", "42"])
async def test_configs_that_are_not_json_objects_are_refused(
    store: aioredis.Redis, publisher: ConfigPublisher, bad: str
) -> None:
    with pytest.raises(StoreError, match="JSON"):
        await publisher.upsert("ns/gw", bad)
    assert await store.exists(CONFIGS_HASH) == 0


async def test_reader_snapshot_and_events_line_up(
    store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    reader = ConfigReader(store)
    await publisher.upsert("ns/a", config("ns/a"))
    snapshot = await reader.load_snapshot()
    assert snapshot.rev == 1
    assert set(snapshot.configs) == {"ns/a"}
    await publisher.upsert("ns/b", config("ns/b"))
    await publisher.delete("ns/a")
    batch = await reader.read_events(snapshot.last_event_id)
    events = batch.events
    assert batch.last_id == events[-1].event_id
    assert [(e.op, e.id, e.rev) for e in events] == [("upsert", "ns/b", 2), ("delete", "ns/a", 3)]
    assert await reader.events_after(snapshot.last_event_id) == [(events[0].event_id, 2)]


async def test_the_epoch_stays_while_the_store_keeps_its_history_and_changes_when_it_is_lost(
    store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    reader = ConfigReader(store)
    assert (await reader.position()).epoch == ""
    first = await publisher.upsert("ns/a", config("ns/a"))
    assert (await publisher.upsert("ns/b", config("ns/b"))).epoch == first.epoch
    assert not (await publisher.upsert("ns/b", config("ns/b"))).changed
    assert (await reader.load_snapshot()).epoch == first.epoch
    # Another publisher (an operator restart) writes into the same history.
    assert (await ConfigPublisher(store).upsert("ns/c", config("ns/c"))).epoch == first.epoch
    await store.flushall()
    again = await publisher.upsert("ns/a", config("ns/a"))
    assert again.changes == {"ns/a": 1}
    assert again.epoch not in ("", first.epoch)
    position = await reader.position()
    assert (position.epoch, position.rev) == (again.epoch, 1)
    events = (await reader.read_events("0-0")).events
    assert [(e.rev, e.epoch) for e in events] == [(1, again.epoch)]


async def test_a_store_rolled_back_under_the_publisher_gets_a_new_epoch(
    store: aioredis.Redis, publisher: ConfigPublisher
) -> None:
    for realm in ("one", "two", "three"):
        result = await publisher.upsert("ns/a", config("ns/a", realm=realm))
    assert result.rev == 3
    # An older copy of the store comes back: same epoch, a lower counter.
    await store.set(REV_COUNTER, 1)
    rolled = await publisher.upsert("ns/a", config("ns/a", realm="four"))
    assert rolled.changes == {"ns/a": 2}
    assert rolled.epoch != result.epoch
    # A publisher that never saw the higher revisions cannot tell, and keeps the epoch.
    other = ConfigPublisher(store)
    assert (await other.upsert("ns/b", config("ns/b"))).epoch == rolled.epoch
    # An older copy from the first epoch comes back: the publisher remembers that epoch too.
    await store.hset(META_HASH, EPOCH_FIELD, result.epoch)
    await store.set(REV_COUNTER, 1)
    again = await publisher.upsert("ns/a", config("ns/a", realm="five"))
    assert again.epoch not in (result.epoch, rolled.epoch)
