"""The operator notices when Redis forgot what it published, and only then."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from stunner_common.config import parse_config
from stunner_operator.publish import RedisConfigSink
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration

CONFIG = parse_config(
    {
        "version": "v1",
        "admin": {"name": "ns/gw"},
        "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
        "listeners": [],
        "clusters": [],
    }
)


async def test_store_lost_is_true_only_after_redis_dropped_the_published_configs(
    redis: RedisServer,
) -> None:
    sink = RedisConfigSink(redis.url, timeout_s=2.0)
    client = aioredis.Redis.from_url(redis.url)
    try:
        assert not await sink.store_lost()  # nothing published yet: nothing to lose
        await sink.publish({"ns/gw": CONFIG})
        assert not await sink.store_lost()
        await client.flushall()
        assert await sink.store_lost()
        await sink.publish({"ns/gw": CONFIG})
        assert not await sink.store_lost()
        assert await client.hkeys("stunner:configs") == [b"ns/gw"]
    finally:
        await sink.aclose()
        await client.aclose()


async def test_store_lost_is_false_while_redis_is_away(redis: RedisServer) -> None:
    sink = RedisConfigSink(redis.url, timeout_s=1.0)
    try:
        await sink.publish({"ns/gw": CONFIG})
        redis.stop(kill=True)
        assert not await sink.store_lost()
    finally:
        await sink.aclose()
