"""The upstream-compatible REST API, its JSON errors, the token, TLS, health and metrics."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from stunner_common.cds import encode_v1_config
from stunner_common.config import parse_config, self_signed_pair
from stunner_common.io.store import ConfigPublisher
from support.cds import (
    RunningCds,
    config,
    eventually,
    http_get,
    recv_json,
    running_cds,
    wait_rev,
)
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration


async def get(cds: RunningCds, path: str, **kwargs: object) -> httpx.Response:
    return await http_get(cds, path, **kwargs)


async def status_is(cds: RunningCds, path: str, status: int) -> bool:
    return (await get(cds, path)).status_code == status


async def published(publisher: ConfigPublisher, cds: RunningCds, *ids: str) -> None:
    """Publish configs and wait (bounded) until the CDS serves the last revision."""
    result = None
    for config_id in ids:
        result = await publisher.upsert(config_id, parse_config(config(config_id)))
    assert result is not None
    await wait_rev(cds, result.rev)


async def test_list_namespace_and_single_config_bodies_match_upstream(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    await published(publisher, cds, "ns1/gw1", "ns1/gw2", "ns2/gw1")
    all_configs = await get(cds, "/api/v1/configs")
    assert all_configs.status_code == 200
    assert all_configs.headers["content-type"] == "application/json"
    assert all_configs.text.endswith("}]}\n")
    body = all_configs.json()
    assert body["version"] == "v1"
    assert [c["admin"]["name"] for c in body["items"]] == ["ns1/gw1", "ns1/gw2", "ns2/gw1"]
    ns1 = (await get(cds, "/api/v1/configs/ns1")).json()
    assert [c["admin"]["name"] for c in ns1["items"]] == ["ns1/gw1", "ns1/gw2"]
    assert (await get(cds, "/api/v1/configs/empty")).text == '{"version":"v1","items":[]}\n'
    one = await get(cds, "/api/v1/configs/ns2/gw1", params={"node": "worker-1"})
    canonical = json.loads(parse_config(config("ns2/gw1")).canonical_json())
    assert one.text == encode_v1_config(canonical) + "\n"


async def test_unknown_config_is_a_404_with_upstreams_message(cds: RunningCds) -> None:
    response = await get(cds, "/api/v1/configs/ns/missing")
    assert response.status_code == 404
    assert response.text == '{"code":404,"message":"Config not found for ID ns/missing"}\n'


@pytest.mark.parametrize(
    ("path", "status", "needle"),
    [
        ("/api/v1/configs?watch=yes", 400, "parameter watch"),
        ("/api/v1/configs/ns?watch=2", 400, "parameter watch"),
        ("/api/v1/configs/ns/gw?watch=true", 400, "WebSocket"),
        ("/api/v1/configs?watch=1", 400, "WebSocket"),
        ("/api/v1/nothing-here", 404, "Not Found"),
        ("/api/v1/configs/a/b/c", 404, "Not Found"),
    ],
)
async def test_bad_requests_get_json_errors(
    cds: RunningCds, path: str, status: int, needle: str
) -> None:
    response = await get(cds, path)
    assert response.status_code == status
    assert response.json()["code"] == status
    assert needle in response.json()["message"]


async def test_other_methods_get_a_json_405(cds: RunningCds) -> None:
    async with httpx.AsyncClient(base_url=cds.http_url) as http:
        response = await http.post("/api/v1/configs", json={})
    assert response.status_code == 405
    assert response.json()["code"] == 405


async def test_false_watch_is_a_plain_get(cds: RunningCds) -> None:
    for value in ("false", "0", "F"):
        assert (await get(cds, f"/api/v1/configs?watch={value}")).status_code == 200


async def test_bearer_token_guards_rest_and_watch_but_not_health(
    no_leaked_tasks: None, redis: RedisServer
) -> None:
    async with running_cds(redis.url, token="s3cret") as cds:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            response = await get(cds, "/api/v1/configs", headers=headers)
            assert response.status_code == 401
            assert response.json()["code"] == 401
            assert response.headers["www-authenticate"].startswith("Bearer")
        good = {"Authorization": "Bearer s3cret"}
        assert (await get(cds, "/api/v1/configs", headers=good)).status_code == 200
        assert (await get(cds, "/readyz")).status_code == 200
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"{cds.ws_url}/api/v1/configs?watch=true"):
                pass
        assert refused.value.response.status_code == 401
        async with connect(f"{cds.ws_url}/api/v1/configs?watch=true", additional_headers=good):
            pass
        assert (await get(cds, "/healthz")).json()["watchers"] == 0


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert_b64, key_b64 = self_signed_pair("127.0.0.1")
    cert_path, key_path = tmp_path / "cds.crt", tmp_path / "cds.key"
    cert_path.write_bytes(base64.b64decode(cert_b64))
    key_path.write_bytes(base64.b64decode(key_b64))
    return cert_path, key_path


async def test_tls_serves_https_and_wss(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    await publisher.upsert("ns/gw", config("ns/gw"))
    async with running_cds(
        redis.url, tls_cert_file=cert, tls_key_file=key, client_args={"verify": trust}
    ) as cds:
        assert cds.http_url.startswith("https://")
        async with httpx.AsyncClient(base_url=cds.http_url, verify=trust) as http:
            assert (await http.get("/api/v1/configs/ns/gw")).status_code == 200
        async with connect(f"{cds.ws_url}/api/v1/configs/ns/gw?watch=true", ssl=trust) as ws:
            assert (await recv_json(ws))["admin"]["name"] == "ns/gw"
            # changes written straight to the TLS transport arrive as frames all the same
            for realm in ("r-1", "r-2"):
                await publisher.upsert("ns/gw", config("ns/gw", realm))
            assert [(await recv_json(ws))["auth"]["realm"] for _ in range(2)] == ["r-1", "r-2"]
        async with httpx.AsyncClient(base_url=cds.http_url, verify=trust) as http:
            metrics = (await http.get("/metrics")).text
        assert 'stunner_cds_frames_direct_total{mode="v1"} 2.0' in metrics


async def test_readiness_follows_redis_and_configs_keep_being_served(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    await publisher.upsert("ns/gw", config("ns/gw"))
    async with running_cds(redis.url, reconnect_max_s=0.2) as cds:
        await asyncio.to_thread(redis.stop)
        await eventually(lambda: status_is(cds, "/readyz", 503), what="not ready")
        assert (await get(cds, "/readyz")).json()["code"] == 503
        assert (await get(cds, "/api/v1/configs/ns/gw")).status_code == 200
        await asyncio.to_thread(redis.start)
        await eventually(lambda: status_is(cds, "/readyz", 200), what="ready again")


async def test_metrics_count_watchers_and_frames(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    await publisher.upsert("ns/gw", config("ns/gw"))
    async with connect(f"{cds.ws_url}/api/v1/configs/ns/gw?watch=true") as ws:
        await recv_json(ws)
        text = (await get(cds, "/metrics")).text
        assert 'stunner_cds_watchers{mode="v1"} 1.0' in text
        assert 'stunner_cds_frames_sent_total{mode="v1"} 1.0' in text
        assert "stunner_cds_event_lag_seconds_count" in text
        assert "stunner_cds_redis_up 1.0" in text


async def test_openapi_documents_every_path(cds: RunningCds) -> None:
    schema = (await get(cds, "/openapi.json")).json()
    assert set(schema["paths"]) == {
        "/api/v1/configs",
        "/api/v1/configs/{namespace}",
        "/api/v1/configs/{namespace}/{name}",
        "/api/v1/license",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    assert "stunner.cds.v2" in json.dumps(schema)
    assert (await get(cds, "/docs")).status_code == 200


async def test_node_query_rewrites_the_node_address_placeholder_like_upstream(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    body = config("ns/gw")
    body["listeners"][0]["address"] = "__node_address_placeholder"
    result = await publisher.upsert("ns/gw", parse_config(body))
    await wait_rev(cds, result.rev)
    with_node = (await get(cds, "/api/v1/configs/ns/gw", params={"node": "worker-1"})).json()
    assert with_node["listeners"][0]["address"] == "$STUNNER_ADDR"
    without = (await get(cds, "/api/v1/configs/ns/gw")).json()
    assert without["listeners"][0]["address"] == "__node_address_placeholder"
    listed = (await get(cds, "/api/v1/configs/ns", params={"node": "worker-1"})).json()
    assert listed["items"][0]["listeners"][0]["address"] == "__node_address_placeholder"


async def test_license_status_is_upstreams_free_tier_answer(cds: RunningCds) -> None:
    response = await get(cds, "/api/v1/license")
    assert response.status_code == 200
    assert response.text == (
        '{"enabledFeatures":[],"subscriptionType":"free","lastUpdated":"N/A","lastError":""}\n'
    )
