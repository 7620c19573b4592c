"""stunnerd integration fixtures: a UDP echo peer, a real CDS process and a config publisher.

The stunnerd process wrapper itself (`ManagedStunnerd`) is in `support.stunnerd_process`; the
in-process dataplane on loopback is in `fixtures.stunnerd.inproc`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from stunner_common.io.store import ConfigPublisher
from support.cds_server import CdsServer
from support.echo import UdpEcho, udp_echo
from support.redis_server import RedisServer


@pytest.fixture
async def echo() -> AsyncIterator[UdpEcho]:
    """A UDP echo peer on loopback."""
    async with udp_echo() as peer:
        yield peer


@pytest.fixture
def cds(redis: RedisServer, tmp_path: Path) -> Iterator[CdsServer]:
    """The real `stunner-cds` process reading the test's redis-server."""
    server = CdsServer(redis.url, tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def publisher(redis: RedisServer) -> AsyncIterator[ConfigPublisher]:
    """Writes configs into the test's redis-server the way the operator does."""
    client = aioredis.from_url(redis.url)
    yield ConfigPublisher(client)
    await client.aclose()
