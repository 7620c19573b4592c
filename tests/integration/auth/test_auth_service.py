"""The auth service against a real CDS and redis-server: live credentials, filters, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from stunner_common.auth import ephemeral_password
from stunner_common.io.store import ConfigPublisher
from support.auth import eventually_ok, running_auth
from support.cds import RunningCds, running_cds
from support.ports import free_port
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration


def gateway_config(config_id: str, port: int, auth: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {"name": config_id},
        "auth": auth,
        "listeners": [
            {
                "name": f"{config_id}/udp",
                "protocol": "TURN-UDP",
                "address": "127.0.0.1",
                "port": port,
                "routes": ["r"],
            }
        ],
        "clusters": [{"name": "r", "type": "STATIC", "endpoints": ["127.0.0.1"]}],
    }


STATIC = {"type": "static", "credentials": {"username": "user-1", "password": "pass-1"}}


@pytest.fixture
async def publisher(redis: RedisServer) -> AsyncIterator[ConfigPublisher]:
    client = aioredis.Redis.from_url(redis.url)
    try:
        yield ConfigPublisher(client)
    finally:
        await client.aclose()


@pytest.fixture
async def cds(no_leaked_tasks: None, redis: RedisServer) -> AsyncIterator[RunningCds]:
    async with running_cds(redis.url) as running:
        yield running


async def eventually_json(http: httpx.AsyncClient, path: str, want: Any) -> Any:
    """GET `path` until its JSON satisfies `want` (bounded); return the last body."""
    body: Any = None
    async with asyncio.timeout(10):
        while True:
            resp = await http.get(path)
            body = resp.json()
            if want(resp.status_code, body):
                return body
            await asyncio.sleep(0.02)


async def test_credentials_follow_the_configs_the_cds_streams(
    cds: RunningCds, publisher: ConfigPublisher
) -> None:
    await publisher.upsert(
        "stunner/udp-gateway", gateway_config("stunner/udp-gateway", 3478, STATIC)
    )
    async with running_auth(cds.http_url) as auth, httpx.AsyncClient(base_url=auth.url) as http:
        body = (await http.get("/", params={"service": "turn", "ttl": 300})).json()
        assert body == {
            "username": "user-1",
            "password": "pass-1",
            "ttl": 300,
            "uris": ["turn:127.0.0.1:3478?transport=udp"],
        }

        await publisher.upsert(
            "media/gw",
            gateway_config("media/gw", 3480, {"type": "ephemeral", "credentials": {"secret": "s"}}),
        )
        ice = await eventually_json(
            http,
            "/ice?service=turn&namespace=media&username=bob&iceTransportPolicy=relay",
            lambda code, _body: code == 200,
        )
        server = ice["iceServers"][0]
        assert ice["iceTransportPolicy"] == "relay"
        assert server["urls"] == ["turn:127.0.0.1:3480?transport=udp"]
        assert server["username"].endswith(":bob")
        assert server["credential"] == ephemeral_password("s", server["username"])

        await publisher.delete("media/gw")
        gone = await eventually_json(
            http, "/ice?service=turn&namespace=media", lambda code, _body: code == 404
        )
        assert gone == {"code": 404, "message": gone["message"]}
        assert "namespace=media" in gone["message"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({}, "service must be 'turn'"),
        ({"service": "stun"}, "service must be 'turn'"),
        ({"service": "turn", "ttl": "soon"}, "ttl"),
        ({"service": "turn", "ttl": "0"}, "ttl must be between"),
        ({"service": "turn", "iceTransportPolicy": "any"}, "iceTransportPolicy must be"),
    ],
)
async def test_bad_queries_get_a_400_with_a_json_reason(
    cds: RunningCds, publisher: ConfigPublisher, query: dict[str, str], message: str
) -> None:
    await publisher.upsert("stunner/gw", gateway_config("stunner/gw", 3478, STATIC))
    async with running_auth(cds.http_url) as auth, httpx.AsyncClient(base_url=auth.url) as http:
        for path in ("/", "/ice"):
            resp = await http.get(path, params=query)
            assert resp.status_code == 400, resp.text
            assert resp.json()["code"] == 400
            assert message in resp.json()["message"]


async def test_a_bearer_token_guards_the_api_but_not_the_probes(
    cds: RunningCds, publisher: ConfigPublisher
) -> None:
    await publisher.upsert("stunner/gw", gateway_config("stunner/gw", 3478, STATIC))
    async with (
        running_auth(cds.http_url, token="t0ken") as auth,
        httpx.AsyncClient(base_url=auth.url) as http,
    ):
        assert (await http.get("/readyz")).status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "t0ken"}):
            resp = await http.get("/ice", params={"service": "turn"}, headers=headers)
            assert resp.status_code == 401
            assert resp.headers["www-authenticate"] == "Bearer"
            assert resp.json() == {"code": 401, "message": "missing or wrong bearer token"}
        ok = await http.get(
            "/ice", params={"service": "turn"}, headers={"Authorization": "Bearer t0ken"}
        )
        assert ok.status_code == 200
        assert ok.json()["iceServers"][0]["username"] == "user-1"


async def test_the_service_is_not_ready_until_the_cds_answers(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    await publisher.upsert("stunner/gw", gateway_config("stunner/gw", 3478, STATIC))
    cds_port = free_port()
    async with (
        running_auth(f"http://127.0.0.1:{cds_port}", ready=False) as auth,
        httpx.AsyncClient(base_url=auth.url) as http,
    ):
        assert (await http.get("/readyz")).status_code == 503
        early = await http.get("/", params={"service": "turn"})
        assert early.status_code == 503
        assert "config discovery service" in early.json()["message"]
        async with running_cds(redis.url, port=cds_port):
            await eventually_ok(f"{auth.url}/readyz")
            ok = await http.get("/", params={"service": "turn"})
            assert ok.json()["username"] == "user-1"


async def test_a_head_ten_times_the_limit_is_refused_and_honest_requests_still_answer(
    cds: RunningCds,
) -> None:
    limit = 4096
    async with running_auth(cds.http_url, ready=False, max_header_bytes=limit) as auth:
        reader, writer = await asyncio.open_connection("127.0.0.1", auth.port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (10 * limit))
            await writer.drain()
            async with asyncio.timeout(10):
                answer = await reader.read()  # until the server closes
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 431 ")
        async with httpx.AsyncClient(base_url=auth.url) as http:
            for _ in range(20):
                assert (await http.get("/healthz")).status_code == 200
