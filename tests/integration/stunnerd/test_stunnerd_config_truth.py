"""Config truth, with real processes: a stunnerd never serves a stale config, one bad listener
never takes the others down, and readiness tells the truth.

Each test is one of the failure cases found against upstream's bug history:
1. a stunnerd paused while Redis came back empty, whose old revision the new numbering passed,
   must still get the revocation of a peer (epochs);
2. a TURN-TLS listener whose key does not match its certificate, beside a UDP listener, on a
   fresh and on a running stunnerd: the rest serves, later edits apply;
3. a listener on a port another process holds: the rest of the edit applies, the listener is
   retried with backoff and serves once the port is freed;
4. a Gateway with no listener left (TLS-only without its Secret) is not ready; a metrics port
   that cannot be bound keeps every field of `/status`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from stunner_common.config import self_signed_pair
from stunner_common.io.store import ConfigPublisher
from stunner_operator.render.engine import Renderer
from support.cds_server import CdsServer
from support.echo import UdpEcho, udp_echo
from support.operator import HIERARCHY, objects_from_yaml
from support.ports import free_port, free_udp_tcp_port
from support.redis_server import RedisServer
from support.stunnerd_process import (
    PASSWORD,
    USER,
    EchoAllocation,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = pytest.mark.integration

GATEWAY = "stunner/udp-gateway"
RETRY = {"STUNNERD_LISTENER_RETRY_MIN_S": "0.1", "STUNNERD_LISTENER_RETRY_MAX_S": "0.5"}


def listener(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(lst for lst in doc["listeners"] if lst["name"] == name)


async def ready_code(stunnerd: ManagedStunnerd) -> int:
    return (await stunnerd.get("/ready")).status_code


@pytest.fixture
async def echo() -> AsyncIterator[UdpEcho]:
    async with udp_echo() as peer:
        yield peer


# --- 1. an empty Redis while a stunnerd is away ----------------------------------------------


def gateway_config(port: int, prefix: str, quota: int = 0) -> dict[str, Any]:
    """What the operator renders for a TURN-UDP Gateway routed to a StaticService `prefix`."""
    return {
        "version": "v1",
        "admin": {"name": GATEWAY, "loglevel": "all:INFO", "user_quota": quota},
        "auth": {"type": "static", "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [
            {
                "name": f"{GATEWAY}/udp-listener",
                "protocol": "TURN-UDP",
                "address": "$STUNNER_ADDR",
                "port": port,
                "routes": ["stunner/echo"],
            }
        ],
        "clusters": [{"name": "stunner/echo", "type": "STATIC", "endpoints": [prefix]}],
    }


@pytest.mark.parametrize("after_reset", [0, 4, 8], ids=["below", "equal", "past"])
async def test_a_stunnerd_away_while_redis_came_back_empty_gets_the_revocation(
    tmp_path: Path, redis: RedisServer, after_reset: int
) -> None:
    port = free_udp_tcp_port()
    client = aioredis.from_url(redis.url)
    try:
        for quota in range(1, 6):  # the stunnerd holds revision 5 of the first history
            first = await ConfigPublisher(client).upsert(
                GATEWAY, gateway_config(port, "127.0.0.1/32", quota)
            )
    finally:
        await client.aclose()
    assert first.rev == 5
    cds = CdsServer(redis.url, tmp_path)
    cds.start()
    stunnerd = ManagedStunnerd(
        tmp_path,
        None,
        "-w",
        "--id",
        GATEWAY,
        origin=f"ws://127.0.0.1:{cds.port}",
        health=health_port(),
        env={"STUNNER_ADDR": "127.0.0.1"},
    )
    paused = False
    try:
        held = await stunnerd.wait_status(
            lambda s: s.get("revision") == 5 and s.get("status") == "READY", "revision 5"
        )
        async with udp_echo("127.0.0.1") as old_peer, udp_echo("127.0.0.3") as new_peer:
            before = await EchoAllocation.open(port, old_peer.addr)
            assert await before.echoes()
            # The stunnerd is paused and cut off; Redis comes back empty; the operator
            # publishes again and revokes 127.0.0.1, then more changes number on.
            os.kill(stunnerd.proc.pid, signal.SIGSTOP)
            paused = True
            cds.stop()
            await asyncio.to_thread(redis.restart_empty)
            client = aioredis.from_url(redis.url)
            try:
                publisher = ConfigPublisher(client)
                revoked = await publisher.upsert(GATEWAY, gateway_config(port, "127.0.0.3/32"))
                for i in range(after_reset):
                    await publisher.upsert(f"other/gw-{i}", gateway_config(port + 1, "10.0.0.1"))
            finally:
                await client.aclose()
            assert revoked.rev == 1
            cds.start()
            os.kill(stunnerd.proc.pid, signal.SIGCONT)
            paused = False
            back = time.monotonic()
            status = await stunnerd.wait_status(
                lambda s: s["clusters"][0]["endpoints"] == ["127.0.0.3"], "the revocation"
            )
            took = time.monotonic() - back
            assert took < 5.0, f"the revocation took {took:.1f} s"
            assert not await before.echoes(wait_s=1.5), "the revoked peer is still relayed to"
            before.abandon()
            after = await EchoAllocation.open(port, new_peer.addr)
            assert await after.echoes(), "the new route serves"
            await after.close()
            # What /status shows: the revision and the epoch of the new history.
            assert held["epoch"] == first.epoch
            assert revoked.epoch != first.epoch
            assert (status["revision"], status["epoch"]) == (1, revoked.epoch)
    finally:
        if paused:
            os.kill(stunnerd.proc.pid, signal.SIGCONT)
        await stunnerd.close()
        cds.stop()


# --- 2. a key that does not match its certificate --------------------------------------------


def mismatched_pair() -> tuple[str, str]:
    cert, _ = self_signed_pair("127.0.0.1")
    _, other_key = self_signed_pair("127.0.0.1")
    return cert, other_key


def tls_listener(name: str, port: int, cert: str, key: str) -> dict[str, Any]:
    return {
        "name": name,
        "protocol": "TURN-TLS",
        "address": "127.0.0.1",
        "port": port,
        "routes": ["echo"],
        "cert": cert,
        "key": key,
    }


def udp_listener(name: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "protocol": "TURN-UDP",
        "address": "127.0.0.1",
        "port": port,
        "routes": ["echo"],
    }


async def test_a_fresh_stunnerd_with_a_mismatched_key_serves_its_other_listeners(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("udp")
    cfg = base_config(health_port(), ports)
    cfg["listeners"].append(tls_listener("tls", free_udp_tcp_port(), *mismatched_pair()))
    stunnerd = ManagedStunnerd(tmp_path, cfg)
    try:
        status = await stunnerd.ready()
        assert await ready_code(stunnerd) == 200
        assert listener(status, "udp")["state"] == "serving"
        tls = listener(status, "tls")
        assert tls["state"] == "rejected"
        assert "does not match the certificate" in tls["reason"]
        assert status["configs"]["rejected"] == 0
        alloc = await EchoAllocation.open(ports["udp"], echo.addr)
        assert await alloc.echoes()
        await alloc.close()
    finally:
        await stunnerd.close()


async def test_a_running_stunnerd_takes_a_mismatched_key_and_still_applies_later_edits(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("udp")
    stunnerd = ManagedStunnerd(tmp_path, base_config(health_port(), ports))
    try:
        await stunnerd.ready()
        cfg = copy.deepcopy(stunnerd.config)
        cfg["listeners"].append(tls_listener("tls", free_udp_tcp_port(), *mismatched_pair()))
        second = free_udp_tcp_port()
        cfg["listeners"].append(udp_listener("udp2", second))
        status = await stunnerd.write(cfg)
        assert listener(status, "tls")["state"] == "rejected"
        assert listener(status, "udp2")["state"] == "serving"
        # Not frozen: a UDP listener added afterwards starts, the TLS one stays out.
        third = free_udp_tcp_port()
        cfg["listeners"].append(udp_listener("udp3", third))
        status = await stunnerd.write(cfg)
        assert listener(status, "udp3")["state"] == "serving"
        assert listener(status, "tls")["state"] == "rejected"
        for port in (ports["udp"], second, third):
            alloc = await EchoAllocation.open(port, echo.addr)
            assert await alloc.echoes()
            await alloc.close()
        # The Secret is fixed: the listener comes up.
        cert, key = self_signed_pair("127.0.0.1")
        listener(cfg, "tls").update(cert=cert, key=key)
        status = await stunnerd.write(cfg)
        assert listener(status, "tls")["state"] == "serving"
        scrape = await stunnerd.get("/status")
        assert scrape.status_code == 200
    finally:
        await stunnerd.close()


# --- 3. a port another process holds ---------------------------------------------------------


@contextmanager
def held_port() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A UDP port held by another process, until it is killed."""
    port = free_udp_tcp_port()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.bind(('127.0.0.1', {port}))\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        yield port, holder
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_port_held_by_another_process_is_retried_until_it_is_freed(
    tmp_path: Path, echo: UdpEcho, workers: int
) -> None:
    ports = listener_ports("a")
    args = ["--udp-thread-num", str(workers)] if workers > 1 else []
    stunnerd = ManagedStunnerd(tmp_path, base_config(health_port(), ports), *args, env=RETRY)
    try:
        await stunnerd.ready()
        with held_port() as (busy, holder):
            cfg = copy.deepcopy(stunnerd.config)
            good = free_udp_tcp_port()
            cfg["listeners"] += [udp_listener("busy", busy), udp_listener("good", good)]
            status = await stunnerd.write(cfg)
            assert status["configs"]["rejected"] == 0
            assert listener(status, "good")["state"] == "serving"
            busy_state = listener(status, "busy")
            assert busy_state["state"] == "retrying"
            assert "in use" in busy_state["reason"]
            alloc = await EchoAllocation.open(good, echo.addr)
            assert await alloc.echoes(), "the good listener of the same edit serves"
            await alloc.close()
            status = await stunnerd.wait_status(
                lambda s: listener(s, "busy").get("attempts", 0) >= 3, "retries with backoff"
            )
            assert await ready_code(stunnerd) == 200
            holder.kill()
            holder.wait()
        status = await stunnerd.wait_status(
            lambda s: listener(s, "busy")["state"] == "serving", "the freed port serves"
        )
        alloc = await EchoAllocation.open(busy, echo.addr)
        assert await alloc.echoes()
        await alloc.close()
        assert f"listener busy ready on port {busy}" in stunnerd.log()
    finally:
        await stunnerd.close()


async def test_apply_failures_are_counted_by_reason_in_the_metrics(tmp_path: Path) -> None:
    ports = listener_ports("a")
    cfg = base_config(health_port(), ports)
    metrics = free_port()
    cfg["admin"]["metrics_endpoint"] = f"http://127.0.0.1:{metrics}/metrics"
    with held_port() as (busy, _holder):
        cfg["listeners"] += [
            udp_listener("busy", busy),
            tls_listener("tls", free_udp_tcp_port(), *mismatched_pair()),
        ]
        stunnerd = ManagedStunnerd(tmp_path, cfg, env=RETRY)
        try:
            await stunnerd.ready()
            await stunnerd.wait_status(
                lambda s: listener(s, "busy").get("attempts", 0) >= 2, "two tries"
            )
            async with httpx.AsyncClient() as http:
                scrape = (await http.get(f"http://127.0.0.1:{metrics}/metrics")).text
            assert 'stunner_config_apply_failures_total{reason="bad_certificate"} 1.0' in scrape
            assert 'stunner_config_apply_failures_total{reason="port_in_use"}' in scrape
            assert 'stunner_listeners{state="serving"} 1.0' in scrape
            assert 'stunner_listeners{state="retrying"} 1.0' in scrape
            assert 'stunner_listeners{state="rejected"} 1.0' in scrape
        finally:
            await stunnerd.close()


# --- 4. readiness and a complete /status -----------------------------------------------------

TLS_ONLY_GATEWAY = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: stunner}
spec:
  gatewayClassName: stunner
  addresses: [{type: IPAddress, value: 127.0.0.1}]
  listeners:
  - {name: tls, port: 443, protocol: TURN-TLS, tls: {certificateRefs: [{name: missing}]}}
"""


def rendered(*manifests: str) -> dict[str, Any]:
    """The config the operator renders for Gateway stunner/gw from these manifests."""
    renderer = Renderer()
    renderer.apply(objects_from_yaml("\n---\n".join(manifests)))
    config: dict[str, Any] = json.loads(renderer.configs()["stunner/gw"].canonical_json())
    return config


async def test_a_gateway_left_with_no_listener_is_not_ready(tmp_path: Path, echo: UdpEcho) -> None:
    cfg = rendered(HIERARCHY, TLS_ONLY_GATEWAY)
    assert cfg["listeners"] == []  # the operator left the TLS listener out (no Secret)
    health = health_port()
    stunnerd = ManagedStunnerd(tmp_path, cfg, health=health)
    try:
        status = await stunnerd.wait_status(
            lambda s: s["configs"]["applied"] >= 1, "the listener-less config applied"
        )
        assert status["status"] == "NOT-READY"
        assert await ready_code(stunnerd) == 503
        port = free_udp_tcp_port()
        cfg["listeners"] = [udp_listener("stunner/gw/udp", port)]
        cfg["clusters"] = [{"name": "echo", "type": "STATIC", "endpoints": ["127.0.0.1"]}]
        await stunnerd.write(cfg)
        assert await ready_code(stunnerd) == 200
        cfg["listeners"] = []
        status = await stunnerd.write(cfg)
        assert status["status"] == "NOT-READY"
        assert await ready_code(stunnerd) == 503
    finally:
        await stunnerd.close()


async def test_a_metrics_port_that_cannot_be_bound_leaves_status_complete(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("a")
    cfg = base_config(health_port(), ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        cfg["admin"]["metrics_endpoint"] = f"http://127.0.0.1:{taken}/metrics"
        stunnerd = ManagedStunnerd(tmp_path, cfg)
        try:
            await stunnerd.ready()
            # The admin servers bind after the dataplane has its config: READY may come first.
            status = await stunnerd.wait_status(
                lambda s: "metrics_error" in s.get("admin", {}), "the metrics bind error"
            )
            for key in ("admin", "auth", "listeners", "clusters", "revision", "epoch"):
                assert key in status, key
            assert status["admin"]["name"] == "default/gw"
            assert "cannot listen" in status["admin"]["metrics_error"]
            assert [lst["name"] for lst in status["listeners"]] == ["a"]
            assert [c["name"] for c in status["clusters"]] == ["echo", "elsewhere"]
            alloc = await EchoAllocation.open(ports["a"], echo.addr)
            assert await alloc.echoes()
            await alloc.close()
        finally:
            await stunnerd.close()


async def test_only_a_config_invalid_as_a_whole_is_rejected_with_its_reason(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("a")
    stunnerd = ManagedStunnerd(tmp_path, base_config(health_port(), ports))
    try:
        await stunnerd.ready()
        bad = copy.deepcopy(stunnerd.config)
        bad["listeners"][0]["port"] = 70000
        status = await stunnerd.write(bad, expect="rejected")
        assert status["configs"]["rejected"] == 1
        assert "70000" in status["lastRejection"]["reason"]
        assert listener(status, "a")["state"] == "serving"
        alloc = await EchoAllocation.open(ports["a"], echo.addr)
        assert await alloc.echoes(), "the config in force keeps serving"
        await alloc.close()
    finally:
        await stunnerd.close()


async def test_the_whole_stack_revokes_a_peer_after_an_empty_redis_while_stunnerd_was_away(
    tmp_path: Path,
) -> None:
    """The issue's reproduction, end to end: the operator (local mode) re-publishes into the
    empty Redis, the StaticService moves from 127.0.0.1/32 to 127.0.0.3/32, and enough other
    edits follow for the new numbering to pass the revision the paused stunnerd holds."""
    from support.security_stack import running_stack

    async with running_stack(tmp_path, token=False, debug=False) as stack:
        route = stack.manifests / "route.yaml"
        original_route = route.read_text()
        for i in range(3):  # a few edits: the stunnerd's revision climbs
            stack.add_prefix(f"10.9.{i}.0/24")
            await stack.wait_status(
                lambda s, i=i: f"10.9.{i}.0/24" in stack.endpoints_of(s), f"edit {i}"
            )
        held = await stack.status()
        client = aioredis.from_url(stack.redis.url)
        try:
            async with udp_echo("127.0.0.1") as old_peer, udp_echo("127.0.0.3") as new_peer:
                user, password = stack.secrets.user, stack.secrets.password
                before = await EchoAllocation.open(stack.udp_port, old_peer.addr, user, password)
                assert await before.echoes()
                stunnerd = stack.procs["stunnerd"]
                os.kill(stunnerd.pid, signal.SIGSTOP)
                try:
                    stack.kill("cds0")
                    stack.kill("redis")
                    stack.wipe_redis()
                    await asyncio.to_thread(stack.restart, "redis")
                    route.write_text(original_route.replace("127.0.0.1/32", "127.0.0.3/32"))
                    gateways = stack.manifests / "gateways.yaml"
                    text = gateways.read_text()
                    port = stack.tcp_port
                    # The operator re-publishes; then only the TCP Gateway changes, until the
                    # counter passes the revision the paused stunnerd holds.
                    while int(await _counter(client)) <= held["revision"] + 1:
                        new_port = free_udp_tcp_port()
                        text = text.replace(f"port: {port}", f"port: {new_port}")
                        port = new_port
                        gateways.write_text(text)
                        await _counter_moves(client)
                    await asyncio.to_thread(stack.restart, "cds0")
                finally:
                    os.kill(stunnerd.pid, signal.SIGCONT)
                took = await stack.wait_status(
                    lambda s: stack.endpoints_of(s) == ["127.0.0.3"], "the revocation"
                )
                assert took < 5.0, f"the revocation took {took:.1f} s"
                status = await stack.status()
                assert status["epoch"] != held["epoch"]
                assert status["revision"] <= held["revision"], "the new numbering was reused"
                assert not await before.echoes(wait_s=1.5), "the revoked peer is still relayed"
                before.abandon()
                after = await EchoAllocation.open(stack.udp_port, new_peer.addr, user, password)
                assert await after.echoes()
                await after.close()
        finally:
            await client.aclose()


async def _counter(client: aioredis.Redis) -> int:
    for _ in range(100):
        try:
            return int(await client.get("stunner:rev") or 0)
        except (OSError, aioredis.ConnectionError):
            await asyncio.sleep(0.1)
    raise AssertionError("Redis did not come back")


async def _counter_moves(client: aioredis.Redis, timeout_s: float = 15.0) -> None:
    start = await _counter(client)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await _counter(client) > start:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the operator did not publish the edit")
