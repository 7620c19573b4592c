"""Every row of the reconcile change table, applied to a running stunnerd with live allocations.

Each step rewrites the config file and asserts, with real TURN traffic (aioice clients relaying
to a UDP echo peer), which allocations survived the change and which were dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stunner_common.config import zero_config
from support.echo import UdpEcho
from support.stunnerd_process import (
    USER,
    EchoAllocation,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def stunnerd(tmp_path: Path) -> AsyncIterator[ManagedStunnerd]:
    ports = listener_ports("a", "b")
    server = ManagedStunnerd(tmp_path, base_config(health_port(), ports))
    try:
        await server.ready()
        yield server
    finally:
        await server.close()


def listener(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return next(lst for lst in cfg["listeners"] if lst["name"] == name)


async def two_allocations(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> tuple[EchoAllocation, EchoAllocation]:
    peer = (echo.host, echo.port)
    a = await EchoAllocation.open(listener(stunnerd.config, "a")["port"], peer)
    b = await EchoAllocation.open(listener(stunnerd.config, "b")["port"], peer)
    assert await a.echoes()
    assert await b.echoes()
    return a, b


async def test_in_place_changes_keep_every_allocation_relaying(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> None:
    a, b = await two_allocations(stunnerd, echo)
    relays = (a.relay, b.relay)
    steps: list[tuple[str, Any]] = [
        ("public address", lambda c: listener(c, "a").update(public_address="1.2.3.4")),
        ("public port", lambda c: listener(c, "a").update(public_port=30478)),
        ("routes", lambda c: listener(c, "b").update(routes=["echo", "elsewhere"])),
        ("credentials", lambda c: c["auth"]["credentials"].update(password="rotated")),
        (
            "auth type",
            lambda c: c.update(auth={"type": "ephemeral", "credentials": {"secret": "s"}}),
        ),
        ("cluster endpoints", lambda c: c["clusters"][0].update(endpoints=["127.0.0.0/8"])),
        (
            "cluster added",
            lambda c: c["clusters"].append({"name": "x", "endpoints": ["10.1.0.0/16"]}),
        ),
        ("loglevel", lambda c: c["admin"].update(loglevel="all:DEBUG")),
        ("quota", lambda c: c["admin"].update(user_quota=12)),
        ("admin name", lambda c: c["admin"].update(name="default/other")),
        ("offload", lambda c: c["admin"].update(offload_engine="XDP")),
    ]
    for what, edit in steps:
        cfg = copy.deepcopy(stunnerd.config)
        edit(cfg)
        await stunnerd.write(cfg)
        assert await a.echoes(), f"allocation on a stopped relaying after a {what} change"
        assert await b.echoes(), f"allocation on b stopped relaying after a {what} change"
    assert (a.relay, b.relay) == relays
    status = await stunnerd.status()
    assert status["admin"]["quota"] == "12"
    assert status["allocationCount"] == 2
    assert "rotated" not in str(status)
    await a.close()
    await b.close()


async def test_a_route_change_applies_at_once_to_a_live_allocation(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> None:
    a, b = await two_allocations(stunnerd, echo)
    cfg = copy.deepcopy(stunnerd.config)
    listener(cfg, "a")["routes"] = ["elsewhere"]
    await stunnerd.write(cfg)
    assert not await a.echoes(wait_s=1.0), "a peer outside every route must be refused"
    assert await b.echoes()
    listener(cfg, "a")["routes"] = ["echo"]
    await stunnerd.write(cfg)
    assert await a.echoes(), "the same allocation relays again once the route is back"
    cfg["clusters"] = [c for c in cfg["clusters"] if c["name"] != "echo"]
    await stunnerd.write(cfg)
    assert not await a.echoes(wait_s=1.0)
    assert not await b.echoes(wait_s=1.0)
    a.abandon()
    b.abandon()


@pytest.mark.parametrize(
    ("what", "edit"),
    [
        ("port", lambda c, p: listener(c, "b").update(port=p)),
        ("address", lambda c, p: listener(c, "b").update(address="127.0.0.2")),
        ("protocol", lambda c, p: listener(c, "b").update(protocol="TURN-TCP")),
        ("removed", lambda c, p: c.update(listeners=[listener(c, "a")])),
        ("renamed", lambda c, p: listener(c, "b").update(name="b2")),
    ],
)
async def test_a_listener_restart_or_removal_drops_only_its_own_allocations(
    stunnerd: ManagedStunnerd, echo: UdpEcho, what: str, edit: Any
) -> None:
    a, b = await two_allocations(stunnerd, echo)
    cfg = copy.deepcopy(stunnerd.config)
    edit(cfg, listener_ports("new")["new"])
    await stunnerd.write(cfg)
    assert await a.echoes(), f"listener a was disturbed by a {what} change on b"
    assert not await b.echoes(wait_s=1.0), f"b's allocation survived a {what} change"
    b.abandon()
    await a.close()


async def test_a_realm_change_or_auth_type_crossing_none_drops_every_allocation(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> None:
    a, b = await two_allocations(stunnerd, echo)
    cfg = copy.deepcopy(stunnerd.config)
    cfg["auth"]["realm"] = "other.realm"
    await stunnerd.write(cfg)
    assert not await a.echoes(wait_s=1.0)
    assert not await b.echoes(wait_s=1.0)
    a.abandon()
    b.abandon()
    peer = (echo.host, echo.port)
    fresh = await EchoAllocation.open(listener(cfg, "a")["port"], peer)
    assert await fresh.echoes(), "a new client works in the new realm"
    cfg["auth"] = {"type": "none", "realm": "other.realm"}
    await stunnerd.write(cfg)
    assert not await fresh.echoes(wait_s=1.0), "auth type none must end TURN service"
    fresh.abandon()


async def test_adding_a_listener_starts_it_without_touching_the_others(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> None:
    a, b = await two_allocations(stunnerd, echo)
    cfg = copy.deepcopy(stunnerd.config)
    port = listener_ports("c")["c"]
    cfg["listeners"].append(
        {
            "name": "c",
            "protocol": "TURN-UDP",
            "address": "127.0.0.1",
            "port": port,
            "routes": ["echo"],
        }
    )
    status = await stunnerd.write(cfg)
    assert [lst["name"] for lst in status["listeners"]] == ["a", "b", "c"]
    c = await EchoAllocation.open(port, (echo.host, echo.port))
    assert await c.echoes()
    assert await a.echoes()
    assert await b.echoes()
    for alloc in (a, b, c):
        await alloc.close()


async def test_a_listener_restarted_onto_a_taken_port_is_left_out_and_the_edit_applies(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> None:
    a, b = await two_allocations(stunnerd, echo)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        taken = squatter.getsockname()[1]
        cfg = copy.deepcopy(stunnerd.config)
        listener(cfg, "b")["port"] = taken  # b would restart onto a port that is in use
        cfg["auth"]["credentials"]["password"] = "rotated"
        status = await stunnerd.write(cfg)
        assert status["configs"]["rejected"] == 0
        assert listener(status, "a")["state"] == "serving"
        assert listener(status, "b")["state"] == "retrying"
        assert "in use" in listener(status, "b")["reason"]
        assert await a.echoes(), "a keeps its allocation"
        assert not await b.echoes(wait_s=1.0), "b was restarted, so its allocation ended"
        b.abandon()
        fresh = await EchoAllocation.open(
            listener(cfg, "a")["port"], (echo.host, echo.port), USER, "rotated"
        )
        assert await fresh.echoes(), "the rest of the edit (the password) applied"
    await a.close()
    await fresh.close()


async def test_the_zero_config_and_an_identical_config_change_nothing(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> None:
    a, b = await two_allocations(stunnerd, echo)
    zero = json.loads(zero_config("default/gw").canonical_json())
    await stunnerd.write(zero, expect="ignored")
    assert await a.echoes()
    assert await b.echoes()
    same = copy.deepcopy(stunnerd.config)
    same["listeners"].reverse()  # the same config in another order: nothing to do
    status = await stunnerd.write(same)
    assert status["allocationCount"] == 2
    assert await a.echoes()
    assert await b.echoes()
    assert "listener a: closed" not in stunnerd.log()
    await a.close()
    await b.close()


async def test_health_and_metrics_endpoints_rebind_when_changed(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> None:
    a, _b = await two_allocations(stunnerd, echo)
    new_health, metrics = health_port(), health_port()
    cfg = copy.deepcopy(stunnerd.config)
    cfg["admin"]["healthcheck_endpoint"] = f"http://127.0.0.1:{new_health}"
    cfg["admin"]["metrics_endpoint"] = f"http://127.0.0.1:{metrics}/metrics"
    old = stunnerd.health_port
    assert old is not None
    stunnerd.config = cfg
    stunnerd.path.write_text(json.dumps(cfg))
    stunnerd.health_port = new_health
    await stunnerd.wait_status(
        lambda s: s["admin"]["metrics_endpoint"].endswith("/metrics"), "rebind"
    )
    scrape = (await _answered(stunnerd, "/metrics", metrics)).text
    assert "stunner_allocations_active 2.0" in scrape
    assert 'stunner_listener_allocations_active{name="a"} 1.0' in scrape
    await _refused(stunnerd, "/live", old)
    assert await a.echoes()


async def _answered(stunnerd: ManagedStunnerd, path: str, port: int) -> httpx.Response:
    """``path`` on ``port`` once a server listens there: the admin servers rebind one after
    another as the config is applied, so the new status port may answer before the new metrics
    port does."""
    async with asyncio.timeout(10):
        while True:
            with contextlib.suppress(httpx.ConnectError):
                return await stunnerd.get(path, port)
            await asyncio.sleep(0.05)


async def _refused(stunnerd: ManagedStunnerd, path: str, port: int) -> None:
    """Wait until nothing listens on ``port`` any more (the old server closes as the new one
    starts)."""
    async with asyncio.timeout(10):
        while True:
            try:
                await stunnerd.get(path, port)
            except httpx.ConnectError:
                return
            await asyncio.sleep(0.05)


async def test_a_strict_dns_cluster_admits_its_resolved_peer_and_survives_a_domain_change(
    stunnerd: ManagedStunnerd, echo: UdpEcho
) -> None:
    cfg = copy.deepcopy(stunnerd.config)
    cfg["clusters"].append({"name": "dns", "type": "STRICT_DNS", "endpoints": ["localhost"]})
    for lst in cfg["listeners"]:
        lst["routes"] = ["dns"]
    await stunnerd.write(cfg)
    alloc = await EchoAllocation.open(listener(cfg, "a")["port"], (echo.host, echo.port))
    assert await alloc.echoes(wait_s=5.0, tries=10), "localhost resolves to the echo peer"
    cfg["clusters"][-1]["endpoints"] = ["localhost", "localhost.localdomain"]
    await stunnerd.write(cfg)
    assert "restarted: [cluster: dns]" in stunnerd.log()
    assert await alloc.echoes(), "a cluster restart closes nothing"
    await alloc.close()
