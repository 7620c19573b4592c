"""Publishing rendered configs to Redis, for the CDS to serve.

The operator writes the complete desired set after each render with ``replace_all`` (the shared
``ConfigPublisher``), which touches only configs whose canonical JSON changed and deletes the
ones that are gone, atomically. ``RedisConfigSink`` adds a timeout per write and maps Redis
failures to one error type, so the caller can keep the set and retry. ``store_lost`` tells the
caller when Redis forgot what was published (restarted without its data, or flushed), so that
the whole set is written again: the CDS and every dataplane then get it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from stunner_common.config import StunnerConfig
from stunner_common.contracts.redis_keys import (
    CONFIGS_HASH,
    NODE_ADDRESSES_HASH,
    encode_node_addresses,
)
from stunner_common.io.store import ConfigPublisher, PublishResult, StoreError
from stunner_operator.observe import OperatorMetrics

log = logging.getLogger(__name__)


class PublishError(Exception):
    """A write to Redis failed or timed out; the configs were not (all) published."""


class ConfigSink(Protocol):
    """Where rendered configs go (``RedisConfigSink``; fakes in tests)."""

    async def publish(self, configs: Mapping[str, StunnerConfig]) -> PublishResult: ...

    async def store_lost(self) -> bool: ...


async def publish_configs(
    sink: ConfigSink, configs: Mapping[str, StunnerConfig], metrics: OperatorMetrics
) -> PublishResult:
    """Publish the full set, timed and counted in ``metrics``; one log line per config written
    or deleted. A `PublishError` is marked in the metrics and raised for the caller to retry."""
    try:
        with metrics.loop("publish"):
            result = await sink.publish(configs)
    except PublishError as err:
        metrics.mark_publish_failed(str(err))
        raise
    metrics.mark_published()
    for cid, rev in sorted(result.changes.items()):
        verb = "published" if cid in configs else "deleted"
        log.info("%s config %s (revision %d)", verb, cid, rev)
    return result


class RedisConfigSink:
    """Writes the full set of configs; owns its Redis connection."""

    def __init__(self, redis_url: str, *, timeout_s: float = 5.0) -> None:
        self._redis = aioredis.Redis.from_url(redis_url)
        self._publisher = ConfigPublisher(self._redis)
        self._timeout_s = timeout_s
        self._published: frozenset[str] = frozenset()
        self._node_addresses: dict[str, str] | None = None

    async def publish(self, configs: Mapping[str, StunnerConfig]) -> PublishResult:
        try:
            async with asyncio.timeout(self._timeout_s):
                result = await self._publisher.replace_all(configs)
        except (RedisError, OSError, StoreError, TimeoutError) as err:
            raise PublishError(f"{type(err).__name__}: {err}") from err
        self._published = frozenset(configs)
        return result

    async def publish_node_addresses(self, addresses: Mapping[str, str]) -> bool:
        """Write the Node -> external address map for relay address discovery (the CDS reads
        it), unless it is what this sink wrote last. True when it wrote."""
        if dict(addresses) == self._node_addresses:
            return False
        try:
            async with asyncio.timeout(self._timeout_s):
                stored = await self._redis.hkeys(NODE_ADDRESSES_HASH)
                held = {k.decode() if isinstance(k, bytes) else str(k) for k in stored}
                async with self._redis.pipeline(transaction=True) as pipe:
                    gone = sorted(held - set(addresses))
                    if gone:
                        pipe.hdel(NODE_ADDRESSES_HASH, *gone)
                    if addresses:
                        fields: dict[Any, Any] = encode_node_addresses(addresses)
                        pipe.hset(NODE_ADDRESSES_HASH, mapping=fields)
                    await pipe.execute()
        except (RedisError, OSError, TimeoutError) as err:
            raise PublishError(f"{type(err).__name__}: {err}") from err
        self._node_addresses = dict(addresses)
        return True

    async def store_lost(self) -> bool:
        """True when Redis no longer holds every config this sink published last.

        A Redis that is away answers False: the next publish fails and is retried anyway.
        """
        if not self._published:
            return False
        try:
            async with asyncio.timeout(self._timeout_s):
                stored = await self._redis.hkeys(CONFIGS_HASH)
        except (RedisError, OSError, TimeoutError):
            return False
        held = {key.decode() if isinstance(key, bytes) else str(key) for key in stored}
        return not self._published <= held

    async def ping(self) -> None:
        """Raise PublishError unless Redis answers within the timeout."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._redis.ping()
        except (RedisError, OSError, TimeoutError) as err:
            raise PublishError(f"{type(err).__name__}: {err}") from err

    async def aclose(self) -> None:
        await self._redis.aclose()
