"""Health, readiness, status and metrics scraped over real HTTP from the admin servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stunner_common.config import StunnerConfig, parse_config
from stunnerd.admin.servers import AdminServers
from stunnerd.status import (
    ClusterStats,
    Lifecycle,
    ListenerStats,
    Plan,
    StatsSnapshot,
    TrafficStats,
)

pytestmark = pytest.mark.integration

SNAPSHOT = StatsSnapshot(
    (ListenerStats("udp", 3, 1, 1, TrafficStats(40, 4000, 30, 3000)),),
    (ClusterStats("echo", TrafficStats(25, 2500, 26, 2600)),),
)


def config(health: str | None, metrics: str = "", **admin: Any) -> StunnerConfig:
    return parse_config(
        {
            "version": "v1",
            "admin": {
                "name": "ns/gw",
                "healthcheck_endpoint": health,
                "metrics_endpoint": metrics,
                **admin,
            },
            "auth": {
                "type": "static",
                "credentials": {"username": "secret-user", "password": "secret-pass"},
            },
            "listeners": [
                {"name": "udp", "protocol": "TURN-UDP", "port": 3478, "routes": ["echo"]}
            ],
            "clusters": [{"name": "echo", "endpoints": ["127.0.0.1"]}],
        }
    )


@pytest.fixture
async def admin() -> AsyncIterator[AdminServers]:
    servers = AdminServers(Lifecycle(), lambda: SNAPSHOT, log_override="all:INFO")
    yield servers
    await servers.close()


def url(server: Any, path: str) -> str:
    return f"http://127.0.0.1:{server.bound_port}{path}"


async def test_live_ready_and_status_answer_over_http(
    no_leaked_tasks: None, admin: AdminServers
) -> None:
    await admin.apply_admin(config("http://127.0.0.1:0"), Plan())
    async with httpx.AsyncClient(timeout=5) as http:
        live = await http.get(url(admin.health, "/live"))
        assert (live.status_code, live.json()) == (200, {})
        assert (await http.get(url(admin.health, "/ready"))).status_code == 503
        admin.lifecycle.ready = True
        ready = await http.get(url(admin.health, "/ready"))
        assert ready.json() == {"status": 200, "message": "READY"}
        status = (await http.get(url(admin.health, "/status"))).json()
        admin.lifecycle.draining = True
        assert (await http.get(url(admin.health, "/ready"))).status_code == 503
        assert (await http.get(url(admin.health, "/live"))).status_code == 200
        assert (await http.get(url(admin.health, "/nope"))).status_code == 404
    assert status["allocationCount"] == 3
    assert status["status"] == "READY"
    assert status["listeners"][0]["allocations"] == 3
    assert status["listeners"][0]["stats"]["rx"] == {"pkts": 40, "bytes": 4000}
    assert status["auth"] == {"type": "static", "realm": "stunner.l7mp.io"}
    assert "secret" not in str(status)


async def test_metrics_are_served_on_the_configured_path_with_upstream_names(
    no_leaked_tasks: None, admin: AdminServers
) -> None:
    await admin.apply_admin(config("", "http://127.0.0.1:0/metrics"), Plan())
    assert admin.health is None
    assert admin.metrics is not None
    async with httpx.AsyncClient(timeout=5) as http:
        body = (await http.get(url(admin.metrics, "/metrics"))).text
        assert (await http.get(url(admin.metrics, "/other"))).status_code == 404
    assert "stunner_allocations_active 3.0" in body
    assert 'stunner_cluster_packets_total{direction="rx",name="echo"} 25.0' in body
    assert "process_cpu_seconds_total" in body


async def test_servers_rebind_only_when_their_endpoint_changes(
    no_leaked_tasks: None, admin: AdminServers
) -> None:
    await admin.apply_admin(config("http://127.0.0.1:0"), Plan())
    first = admin.health
    assert first is not None
    old_port = first.bound_port
    await admin.apply_admin(config("http://127.0.0.1:0", loglevel="all:DEBUG"), Plan())
    assert admin.health is first
    await admin.apply_admin(config("http://127.0.0.1:0/elsewhere"), Plan())
    assert admin.health is not first
    assert admin.health is not None
    async with httpx.AsyncClient(timeout=5) as http:
        assert (await http.get(url(admin.health, "/live"))).status_code == 200
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{old_port}/live")
    await admin.apply_admin(config(""), Plan())
    assert admin.health is None


async def test_a_malformed_request_gets_a_400_and_the_server_keeps_serving(
    no_leaked_tasks: None, admin: AdminServers
) -> None:
    import asyncio

    await admin.apply_admin(config("http://127.0.0.1:0"), Plan())
    assert admin.health is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", admin.health.bound_port)
    writer.write(b"NONSENSE\r\n\r\n")
    async with asyncio.timeout(5):
        reply = await reader.read()
    writer.close()
    await writer.wait_closed()
    assert reply.startswith(b"HTTP/1.1 400")
    async with httpx.AsyncClient(timeout=5) as http:
        assert (await http.get(url(admin.health, "/live"))).status_code == 200
