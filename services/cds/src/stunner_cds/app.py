"""The CDS application factory: settings in, a FastAPI app out, nothing built at import time.

The lifespan owns the Redis client and the feed task that keeps the mirror in sync; shutdown
closes every watcher with a reason, cancels the feed and closes Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from stunner_cds import __version__
from stunner_cds.api import configs, health, watch
from stunner_cds.api.common import CdsContext
from stunner_cds.api.direct import ExposeProtocol
from stunner_cds.api.watch import send_watchdog
from stunner_cds.metrics import CdsMetrics
from stunner_cds.settings import CdsSettings
from stunner_cds.store.feed import FeedOptions, RedisFeed, event_lag_s, redis_client
from stunner_cds.store.hub import Hub
from stunner_cds.store.nodes import follow as follow_node_addresses
from stunner_common.io.http import create_service_app
from stunner_common.io.store import StoreEvent

log = logging.getLogger(__name__)

DESCRIPTION = """
The STUNner config discovery service: serves the stunnerd configs the operator renders into
Redis, as plain JSON and as WebSocket watches (`?watch=true`) on the same paths. Without a
subprotocol a watch speaks upstream STUNner's v1 format (one text frame per full config, the zero
config on delete); with the subprotocol `stunner.cds.v2` it sends JSON envelopes with RFC 6902
patches, each carrying the store epoch its revision counts in, and accepts `since=REV&epoch=E` to
resume. Errors are `{"code": N, "message": "..."}`.
"""


def feed_options(settings: CdsSettings) -> FeedOptions:
    """The feed's knobs, taken from the settings once per app."""
    return FeedOptions(
        block_ms=settings.redis_block_ms,
        timeout_s=settings.redis_timeout_s,
        min_backoff_s=settings.reconnect_min_s,
        max_backoff_s=settings.reconnect_max_s,
    )


def create_app(settings: CdsSettings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics = CdsMetrics()

        def observed(event: StoreEvent) -> None:
            metrics.event_lag.observe(event_lag_s(event))

        hub = Hub(max_queue=settings.queue_size, v1_min_interval_s=settings.v1_min_interval_s)
        hub.on_fanout = metrics.fanout.observe
        hub.on_v1_held = metrics.v1_changes_held.inc
        redis = redis_client(
            settings.redis_url, timeout_s=settings.redis_timeout_s, block_ms=settings.redis_block_ms
        )
        feed = RedisFeed(
            redis,
            hub,
            feed_options(settings),
            on_event=observed,
            on_reload=metrics.reloads.inc,
            on_reset=metrics.resets.inc,
        )
        ctx = CdsContext(settings, hub, feed, metrics)
        app.state.cds = ctx
        feed.start()
        watchdog = asyncio.create_task(send_watchdog(ctx), name="cds-send-watchdog")
        nodes = asyncio.create_task(
            follow_node_addresses(redis, settings.redis_timeout_s), name="cds-node-addresses"
        )
        try:
            yield
        finally:
            hub.close_all("server shutting down")
            watchdog.cancel()
            nodes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await nodes
            await feed.stop(settings.shutdown_timeout_s)
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            await redis.aclose()

    app = create_service_app(
        title="STUNner config discovery service",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        routers=[configs.router, watch.router, health.router],
    )
    app.add_middleware(ExposeProtocol)
    return app
