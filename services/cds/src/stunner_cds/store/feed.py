"""Keeps the hub's mirror in step with Redis: snapshot first, then the change stream.

The feed loads a consistent snapshot, tails ``stunner:events`` from the last stream id it holds,
and on any Redis error reconnects with backoff and jitter. On reconnect it checks that the store is
still in the epoch it holds and that the stream continues at ``rev + 1`` after that id; when it
does not (trimmed past us, or Redis came back with less than we had) it reloads the snapshot and
publishes only what differs, so watchers see every change exactly once. While tailing, an entry of
another epoch, or an idle read that finds the epoch changed (a store flushed under a live
connection), reloads as well. A reload that crosses a lost history (another epoch, or fewer
revisions than held) closes every v2 watcher first (``Hub.reset``): their revisions would mean
nothing in the new history. ``ready`` is what ``/readyz`` reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from stunner_cds.store.hub import Hub
from stunner_cds.store.mirror import StreamGapError
from stunner_common.backoff import Backoff
from stunner_common.io.store import ConfigReader, StoreEvent, stream_id_ms

log = logging.getLogger(__name__)


def redis_client(url: str, *, timeout_s: float, block_ms: int) -> aioredis.Redis:
    """A client whose socket timeout outlasts a blocking XREAD, and which never retries itself."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout_s + block_ms / 1000,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


@dataclass(frozen=True, slots=True)
class FeedOptions:
    """How the feed reads Redis and how it backs off; `stunner_cds.app` builds it from the
    settings (``CDS_REDIS_BLOCK_MS``, ``CDS_REDIS_TIMEOUT_S``, ``CDS_RECONNECT_MIN_S``/``MAX_S``).
    """

    block_ms: int = 1000
    """How long one XREAD of the change stream blocks."""
    timeout_s: float = 5.0
    """Bound on every other Redis round trip (the snapshot, the position, the epoch)."""
    min_backoff_s: float = 0.05
    """First delay before reconnecting; doubles, with jitter, up to ``max_backoff_s``."""
    max_backoff_s: float = 2.0


class RedisFeed:
    """Owns the Redis connection of one CDS process and feeds every change into the hub."""

    def __init__(
        self,
        redis: aioredis.Redis,
        hub: Hub,
        options: FeedOptions = FeedOptions(),
        *,
        on_event: Callable[[StoreEvent], None] | None = None,
        on_reload: Callable[[], None] | None = None,
        on_reset: Callable[[], None] | None = None,
    ) -> None:
        self._reader = ConfigReader(redis)
        self.hub = hub
        self._block_ms = options.block_ms
        self._timeout_s = options.timeout_s
        self._backoff = Backoff(initial_s=options.min_backoff_s, cap_s=options.max_backoff_s)
        self._on_event = on_event
        self._on_reload = on_reload
        self._on_reset = on_reset
        self.ready = False
        self.synced = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run the feed in a task this object owns (stop it with ``stop``)."""
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.create_task(self.run(), name="cds-redis-feed")
            self._task.add_done_callback(_log_unexpected_exit)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the feed task, bounded in time.

        redis-py can lose a cancellation that lands right after a pipeline (the task then
        carries on), so besides cancelling, the loop also checks a stop flag between reads.
        """
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        for _ in range(3):
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=timeout_s / 3)
            if done:
                return
        log.error("the Redis feed did not stop within %.1f s", timeout_s)

    async def run(self) -> None:
        """Run until cancelled or stopped; never raises for Redis trouble."""
        attempt = 0
        while not self._stopping:
            try:
                await self._resync()
                self.ready = True
                self.synced.set()
                attempt = 0
                await self._tail()
            except (RedisError, OSError, TimeoutError) as exc:
                delay_s = self._backoff.delay_s(attempt)
                attempt += 1
                if self.ready:
                    log.warning("lost Redis (%s); serving the last configs while reconnecting", exc)
                else:
                    log.info("Redis not reachable (%s); retrying in %.2f s", exc, delay_s)
                self.ready = False
                await asyncio.sleep(delay_s)

    async def _resync(self) -> None:
        mirror = self.hub.mirror
        following: int | None = None
        async with asyncio.timeout(self._timeout_s):
            at = await self._reader.position()
            if mirror.loaded and at.epoch == mirror.epoch and at.rev > mirror.rev:
                after = await self._reader.events_after(mirror.last_event_id)
                following = after[0][1] if after else None
        why = mirror.resync_reason(at, following)
        if why is not None:
            await self._reload(why)

    async def _reload(self, why: str) -> None:
        async with asyncio.timeout(self._timeout_s):
            snapshot = await self._reader.load_snapshot()
        mirror = self.hub.mirror
        held = (mirror.epoch, mirror.rev)
        reset = mirror.is_reset(snapshot)
        closed = self.hub.reload(snapshot)
        if reset:
            log.warning(
                "the config store lost its history (epoch %r at revision %d, held epoch %r at "
                "revision %d): closed %d v2 watchers for a full resync",
                snapshot.epoch,
                snapshot.rev,
                *held,
                closed,
            )
            if self._on_reset:
                self._on_reset()
        log.info(
            "loaded %d configs at revision %d of epoch %r (%s)",
            len(snapshot.configs),
            snapshot.rev,
            snapshot.epoch,
            why,
        )
        if self._on_reload:
            self._on_reload()

    async def _tail(self) -> None:
        mirror = self.hub.mirror
        while not self._stopping:
            async with asyncio.timeout(self._timeout_s + self._block_ms / 1000):
                batch = await self._reader.read_events(
                    mirror.last_event_id, block_ms=self._block_ms
                )
            if batch.last_id is None:
                # Idle: make sure the store is still the one we follow (a flush or a reset
                # under a live connection leaves the stream tail silent, or behind us).
                async with asyncio.timeout(self._timeout_s):
                    epoch = await self._reader.current_epoch()
                if epoch != mirror.epoch:
                    await self._reload(f"store epoch {epoch!r}, mirror at epoch {mirror.epoch!r}")
                continue
            if self._on_event:
                for event in batch.events:
                    self._on_event(event)
            try:
                self.hub.apply(batch.events)
            except StreamGapError as exc:
                await self._reload(str(exc))
                continue
            mirror.skip_to(batch.last_id)  # past malformed entries, if any


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the Redis feed stopped: %r", task.exception())


def event_lag_s(event: StoreEvent) -> float:
    """Seconds from the Redis write (its stream id timestamp) to now."""
    return max(0.0, time.time() - stream_id_ms(event.event_id) / 1000)
