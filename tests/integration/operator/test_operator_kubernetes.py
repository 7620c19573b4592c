"""Kubernetes mode against kmock's Kubernetes emulator (a real HTTP API server) and real Redis.

The controller lists and watches every resource, publishes configs to Redis, writes statuses,
creates the LoadBalancer Service and the Deployment of each Gateway, follows the Service's
load-balancer status into the config, and removes what an invalid or deleted Gateway leaves.
Waits are bounded polls of the API server or Redis stream reads, never bare sleeps.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kmock
import pytest
import redis.asyncio as aioredis

from stunner_common.contracts.redis_keys import CONFIGS_HASH, EVENTS_STREAM
from stunner_common.io.kube.api import KubeApi
from stunner_common.io.kube.config import KubeAccess
from stunner_operator.controller.loops import ControllerOptions, KubeController
from stunner_operator.k8s.resources import DEPLOYMENT, WATCHED
from stunner_operator.publish import RedisConfigSink
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration

DEADLINE_S = 10.0
# The emulator cannot serve the cluster-scoped core `namespaces` collection (its path parser
# takes `namespaces` for a namespace prefix), so Namespace objects are not watched here.
RESOURCES = tuple(r for r in WATCHED if r.kind != "Namespace")

SEED: list[tuple[str, dict[str, Any]]] = [
    (
        "/apis/stunner.l7mp.io/v1/dataplanes",
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "Dataplane",
            "metadata": {"name": "default"},
            "spec": {"image": "stunnerd:test"},
        },
    ),
    (
        "/apis/stunner.l7mp.io/v1/namespaces/stunner/gatewayconfigs",
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": {"name": "gwconfig", "namespace": "stunner"},
            "spec": {"authType": "static", "userName": "user-1", "password": "pass-1"},
        },
    ),
    (
        "/apis/gateway.networking.k8s.io/v1/gatewayclasses",
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "stunner"},
            "spec": {
                "controllerName": "stunner.l7mp.io/gateway-operator",
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": "gwconfig",
                    "namespace": "stunner",
                },
            },
        },
    ),
    (
        "/apis/gateway.networking.k8s.io/v1/namespaces/stunner/gateways",
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {
                "name": "udp-gateway",
                "namespace": "stunner",
                "annotations": {"stunner.l7mp.io/enable-mixed-protocol-lb": "true"},
            },
            "spec": {
                "gatewayClassName": "stunner",
                "listeners": [
                    {"name": "udp-listener", "port": 3478, "protocol": "TURN-UDP"},
                    {"name": "tcp-listener", "port": 3478, "protocol": "TURN-TCP"},
                ],
            },
        },
    ),
    (
        "/apis/stunner.l7mp.io/v1/namespaces/stunner/staticservices",
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "StaticService",
            "metadata": {"name": "peers", "namespace": "stunner"},
            "spec": {"prefixes": ["10.0.0.0/24"]},
        },
    ),
    (
        "/apis/stunner.l7mp.io/v1/namespaces/stunner/udproutes",
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "UDPRoute",
            "metadata": {"name": "media", "namespace": "stunner"},
            "spec": {
                "parentRefs": [{"name": "udp-gateway"}],
                "rules": [
                    {
                        "backendRefs": [
                            {"group": "stunner.l7mp.io", "kind": "StaticService", "name": "peers"}
                        ]
                    }
                ],
            },
        },
    ),
]


@dataclass
class Cluster:
    url: str
    session: aiohttp.ClientSession

    async def request(self, method: str, path: str, body: Any = None, ctype: str = "") -> Any:
        headers = {"Content-Type": ctype or "application/json"}
        async with self.session.request(
            method,
            self.url + path,
            data=json.dumps(body) if body is not None else None,
            headers=headers,
        ) as resp:
            text = await resp.text()
            if resp.status == 404:
                return None
            assert resp.status < 300, f"{method} {path}: {resp.status} {text}"
            return json.loads(text) if text else None

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[kmock.KubernetesEmulator, Cluster]]:
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        for res in RESOURCES:
            if not res.optional:
                emulator.resources[f"{res.api_version}/{res.plural}"] = {}  # type: ignore[assignment]
        emulator.resources[f"{DEPLOYMENT.api_version}/{DEPLOYMENT.plural}"] = {}  # type: ignore[assignment]
        async with aiohttp.ClientSession() as session:
            yield emulator, Cluster(str(emulator.url).rstrip("/"), session)


@pytest.fixture
async def client(redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(redis.url, decode_responses=True)
    try:
        yield conn
    finally:
        await conn.aclose()


@pytest.fixture
async def controller(
    cluster: tuple[kmock.KubernetesEmulator, Cluster], redis: RedisServer
) -> AsyncIterator[KubeController]:
    _emulator, kube = cluster
    for path, body in SEED:
        await kube.request("POST", path, body)
    api = KubeApi(KubeAccess(kube.url, ssl.create_default_context()), timeout_s=5)
    sink = RedisConfigSink(redis.url, timeout_s=2)
    options = ControllerOptions(
        throttle_s=0.02, retry_s=0.05, watch_timeout_s=30, resources=RESOURCES
    )
    ctl = KubeController(api, sink, options)
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop), name="kube-controller")
    try:
        yield ctl
    finally:
        stop.set()
        async with asyncio.timeout(DEADLINE_S):
            await task
        await sink.aclose()
        await api.aclose()


async def eventually(check: Callable[[], Awaitable[Any]]) -> Any:
    """Poll ``check`` until it returns something truthy (bounded by DEADLINE_S)."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.05)


async def config(client: aioredis.Redis, cid: str) -> dict[str, Any] | None:
    raw = await client.hget(CONFIGS_HASH, cid)
    return json.loads(raw) if raw else None


def condition(status: dict[str, Any] | None, ctype: str) -> tuple[str, str] | None:
    for cond in (status or {}).get("conditions", []):
        if cond["type"] == ctype:
            return cond["status"], cond["reason"]
    return None


GW = "/apis/gateway.networking.k8s.io/v1/namespaces/stunner/gateways/udp-gateway"
SVC = "/api/v1/namespaces/stunner/services/udp-gateway"
DEP = "/apis/apps/v1/namespaces/stunner/deployments/udp-gateway"
CLASS = "/apis/gateway.networking.k8s.io/v1/gatewayclasses/stunner"
ROUTE = "/apis/stunner.l7mp.io/v1/namespaces/stunner/udproutes/media"


async def test_kubernetes_mode_renders_publishes_and_writes_back(
    no_leaked_tasks: None,
    cluster: tuple[kmock.KubernetesEmulator, Cluster],
    controller: KubeController,
    client: aioredis.Redis,
) -> None:
    _emulator, kube = cluster
    cfg = await eventually(lambda: config(client, "stunner/udp-gateway"))
    assert cfg["auth"]["credentials"] == {"username": "user-1", "password": "pass-1"}
    assert [c["name"] for c in cfg["clusters"]] == ["stunner/media"]
    assert {ls["public_address"] for ls in cfg["listeners"]} == {""}

    svc = await eventually(lambda: kube.get(SVC))
    assert svc["spec"]["type"] == "LoadBalancer"
    assert [(p["name"], p["protocol"]) for p in svc["spec"]["ports"]] == [
        ("udp-listener", "UDP"),
        ("tcp-listener", "TCP"),
    ]
    dep = await eventually(lambda: kube.get(DEP))
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "stunnerd:test"

    async def gateway_status() -> dict[str, Any] | None:
        gw = await kube.get(GW)
        return gw.get("status") if gw else None

    status = await eventually(gateway_status)
    assert condition(status, "Accepted") == ("True", "Accepted")
    assert condition(status, "Programmed") == ("False", "AddressNotAssigned")
    assert status["conditions"][0]["lastTransitionTime"]
    gwclass = await eventually(lambda: _status_of(kube, CLASS))
    assert condition(gwclass, "Accepted") == ("True", "Accepted")
    route = await eventually(lambda: _status_of(kube, ROUTE))
    assert condition(route["parents"][0], "Accepted") == ("True", "Accepted")

    # The cloud assigns the LoadBalancer an address: the config and the Gateway follow.
    await kube.request(
        "PATCH",
        SVC + "/status",
        {"status": {"loadBalancer": {"ingress": [{"ip": "34.1.2.3"}]}}},
        "application/merge-patch+json",
    )

    async def public_addresses() -> set[str] | None:
        got = await config(client, "stunner/udp-gateway")
        addrs = {ls["public_address"] for ls in got["listeners"]} if got else set()
        return addrs if addrs == {"34.1.2.3"} else None

    await eventually(public_addresses)

    async def programmed() -> bool:
        return condition(await gateway_status(), "Programmed") == ("True", "Programmed")

    await eventually(programmed)

    # Deleting the Gateway deletes its config at once.
    await kube.request("DELETE", GW)

    async def config_gone() -> bool:
        return await client.hget(CONFIGS_HASH, "stunner/udp-gateway") is None

    await eventually(config_gone)
    entries: Any = await client.xrange(EVENTS_STREAM)
    assert entries[-1][1]["op"] == "delete"


async def _status_of(kube: Cluster, path: str) -> dict[str, Any] | None:
    obj = await kube.get(path)
    return obj.get("status") if obj else None


async def test_a_missing_dataplane_invalidates_the_gateway_and_removes_its_dataplane(
    no_leaked_tasks: None,
    cluster: tuple[kmock.KubernetesEmulator, Cluster],
    controller: KubeController,
    client: aioredis.Redis,
) -> None:
    _emulator, kube = cluster
    await eventually(lambda: config(client, "stunner/udp-gateway"))
    await eventually(lambda: kube.get(DEP))
    await kube.request("DELETE", "/apis/stunner.l7mp.io/v1/dataplanes/default")

    async def config_gone() -> bool:
        return await client.hget(CONFIGS_HASH, "stunner/udp-gateway") is None

    await eventually(config_gone)

    async def deployment_gone() -> bool:
        return await kube.get(DEP) is None

    await eventually(deployment_gone)

    async def rejected() -> bool:
        status = await _status_of(kube, GW)
        return condition(status, "Accepted") == ("False", "Pending")

    await eventually(rejected)
    gwclass = await _status_of(kube, CLASS)
    assert condition(gwclass, "Accepted") == ("False", "InvalidParameters")


async def test_kubernetes_mode_is_ready_after_the_first_publish_and_counts_renders(
    no_leaked_tasks: None,
    cluster: tuple[kmock.KubernetesEmulator, Cluster],
    controller: KubeController,
    client: aioredis.Redis,
) -> None:
    await eventually(lambda: config(client, "stunner/udp-gateway"))

    async def ready() -> bool:
        return controller.metrics.ready

    await eventually(ready)
    text = controller.metrics.exposition().decode()
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["stunner_operator_publishes_total"] >= 1
    assert values["stunner_operator_renders_total"] >= 1
    assert values["stunner_operator_ready"] == 1
    assert values['stunner_operator_objects{kind="Gateway"}'] == 1
