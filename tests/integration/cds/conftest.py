"""Fixtures for the CDS integration tests: real redis-server, real uvicorn CDS on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from stunner_common.io.store import ConfigPublisher
from support.cds import RunningCds, running_cds
from support.redis_server import RedisServer


@pytest.fixture
async def store(redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def publisher(store: aioredis.Redis) -> ConfigPublisher:
    return ConfigPublisher(store)


@pytest.fixture
async def cds(no_leaked_tasks: None, redis: RedisServer) -> AsyncIterator[RunningCds]:
    """A CDS on the test's Redis; the test fails if tasks outlive it. It sends v1 watchers every
    change (``CDS_V1_MIN_INTERVAL_S`` 0): these tests check frames one by one and their order
    across configs, which the interval changes by design; its own tests set it."""
    async with running_cds(redis.url, v1_min_interval_s=0) as running:
        yield running
