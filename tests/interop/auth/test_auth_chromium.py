"""Headless Chromium takes its RTCConfiguration from the auth service and relays through stunnerd.

The whole chain is real: a config with ephemeral (TURN REST) auth is published into a real
redis-server, a real CDS streams it to the auth service, the page fetches ``/ice`` (the browser's
own fetch, across origins, so CORS is exercised too) and hands the answer unchanged to its two
RTCPeerConnections, which may only use relay candidates of the stunnerd serving that config.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis.asyncio as aioredis
from fixtures.stunnerd.inproc import make_config, running_server
from interop.stunnerd.test_stunnerd_chromium import chromium, page_result, page_server

from stunner_common.io.store import ConfigPublisher
from support.auth import running_auth
from support.cds import running_cds
from support.processes import which
from support.redis_server import RedisServer

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

MESSAGES = 10


@pytest.fixture
async def publisher(redis: RedisServer) -> AsyncIterator[ConfigPublisher]:
    client = aioredis.Redis.from_url(redis.url)
    try:
        yield ConfigPublisher(client)
    finally:
        await client.aclose()


async def test_chromium_relays_with_the_ice_config_the_auth_service_hands_out(
    tmp_path: Path, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    binary = which("chromium", "/usr/lib/chromium") or which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed")
    config = make_config(
        ("TURN-UDP",), auth={"type": "ephemeral", "credentials": {"secret": "browser-secret"}}
    )
    port = config.listeners[0].port
    await publisher.upsert("stunner/browser-gateway", config.canonical_json())
    async with (
        running_server(config),
        running_cds(redis.url) as cds,
        running_auth(cds.http_url, cors_origins="*") as auth,
        page_server() as http_port,
    ):
        ice = f"{auth.url}/ice?" + urlencode(
            {"service": "turn", "username": "browser", "ttl": 600, "iceTransportPolicy": "relay"}
        )
        url = f"http://127.0.0.1:{http_port}/relay.html?" + urlencode(
            {"ice": ice, "count": MESSAGES}
        )
        async with chromium(binary, url, tmp_path / "profile") as browser_ws:
            async with asyncio.timeout(60):
                result = await page_result(browser_ws)
    assert result.get("ok"), result
    assert result["echoed"] == [f"echo:msg {i}" for i in range(MESSAGES)]
    assert result["localType"] == "relay", result
    assert result["remoteType"] == "relay", result
    assert result["url"] == f"turn:127.0.0.1:{port}?transport=udp", result
