"""The stunnerd CDS client against the real `stunner-cds`, fed through the real Redis publisher.

Covers the path a managed dataplane depends on: the first snapshot, updates as delta patches,
deletes that must not reach the dataplane, and a CDS restart during which a change is published
(the client must resume and catch up).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stunner_common.backoff import Backoff
from stunner_common.io.store import ConfigPublisher
from stunnerd.origin.base import ConfigEvent
from stunnerd.origin.cds import CdsOptions, CdsOrigin
from support.cds_server import CdsServer
from support.stunnerd_process import WATCH_ID, watch_config

pytestmark = pytest.mark.integration

STEP_TIMEOUT_S = 10.0
GATEWAY = CdsOptions("stunner", "udp-gateway")


class Follower:
    def __init__(self, origin: CdsOrigin) -> None:
        self.origin = origin
        self.events: asyncio.Queue[ConfigEvent] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(), name="cds-follow")

    async def _run(self) -> None:
        async for event in self.origin.watch():
            await self.events.put(event)

    async def next(self) -> ConfigEvent:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            return await self.events.get()


@contextlib.asynccontextmanager
async def following(cds: CdsServer, **options: Any) -> AsyncIterator[Follower]:
    origin = CdsOrigin(
        f"http://127.0.0.1:{cds.port}",
        dataclasses.replace(GATEWAY, **options),
        env={"STUNNER_ADDR": "127.0.0.7"},
        backoff=Backoff(initial_s=0.05, cap_s=0.3),
    )
    follower = Follower(origin)
    try:
        yield follower
    finally:
        follower.task.cancel()
        await asyncio.gather(follower.task, return_exceptions=True)


async def test_deltas_deletes_and_a_cds_restart_reach_the_client_in_order(
    no_leaked_tasks: None, cds: CdsServer, publisher: ConfigPublisher
) -> None:
    await publisher.upsert(WATCH_ID, watch_config("one"))
    async with following(cds) as f:
        first = await f.next()
        assert first.config.auth.realm == "one"
        assert first.config.listeners[0].address == "127.0.0.7"
        assert first.revision is not None
        await publisher.upsert(WATCH_ID, watch_config("two"))
        second = await f.next()
        assert second.config.auth.realm == "two"
        assert second.revision is not None
        assert second.revision > first.revision
        await publisher.delete(WATCH_ID)
        await publisher.upsert(WATCH_ID, watch_config("three"))
        assert (await f.next()).config.auth.realm == "three"  # the delete was dropped

        cds.stop()
        await publisher.upsert(WATCH_ID, watch_config("four", port=4000))
        cds.start()
        caught_up = await f.next()
        assert caught_up.config.auth.realm == "four"
        assert caught_up.config.listeners[0].port == 4000
        assert f.origin.connects >= 2


async def test_an_upstream_style_client_gets_full_config_frames(
    no_leaked_tasks: None, cds: CdsServer, publisher: ConfigPublisher
) -> None:
    await publisher.upsert(WATCH_ID, watch_config("one"))
    async with following(cds, offer_v2=False) as f:
        event = await f.next()
        assert event.revision is None
        assert event.config.auth.realm == "one"
        await publisher.upsert(WATCH_ID, watch_config("two"))
        assert (await f.next()).config.auth.realm == "two"


async def test_a_one_shot_load_reads_the_stored_config(
    no_leaked_tasks: None, cds: CdsServer, publisher: ConfigPublisher
) -> None:
    await publisher.upsert(WATCH_ID, watch_config("get"))
    origin = CdsOrigin(f"http://127.0.0.1:{cds.port}", GATEWAY)
    event = await origin.load()
    assert event.config.auth.realm == "get"
