"""The kernel offload through a worker crash and through a hot handoff, in network namespaces.

A paced aioice client relays through a channel that the TC program relays in the kernel; a worker
is killed (`kill -9`), or a second stunnerd takes over through the handoff socket. The kernel
entries stay (the supervisor holds the maps through a crash; after a handoff the successor's
program sits on the hook and the old process leaves it attached), so no datagram is lost and
none waits for user space: the probe's round-trip times stay those of the kernel path.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support import netns
from support.netns import PEER_IP, SERVER_CLIENT_IP, Topology
from support.offload_probe import (
    PASSWORD,
    PEER_PORT,
    UDP_PORT,
    USER,
    kernel_entries,
    probe,
    probe_result,
    require_tool,
)
from support.processes import ServerProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

STUNNERD = str(Path(sys.executable).with_name("stunnerd"))
STATUS = "http://127.0.0.1:8086/status"
WAIT_S = 15.0
SLOW_MS = 200.0
"""A round trip that waited for user space through a restart takes far longer than this."""


def config() -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {
            "name": "test/offload",
            "loglevel": "all:INFO",
            "healthcheck_endpoint": "http://0.0.0.0:8086",
            "offload_engine": "TC",
        },
        "auth": {"type": "static", "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [
            {
                "name": "test/udp",
                "protocol": "TURN-UDP",
                "address": SERVER_CLIENT_IP,
                "port": UDP_PORT,
                "routes": ["test/peers"],
            }
        ],
        "clusters": [{"name": "test/peers", "type": "STATIC", "endpoints": [f"{PEER_IP}/32"]}],
    }


def status(topo: Topology) -> dict[str, Any]:
    text = netns.http_get(topo, topo.server, STATUS)
    return json.loads(text) if text.strip() else {}


def wait(topo: Topology, what: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = status(topo)
        if last and check(last):
            return last
        time.sleep(0.1)
    pytest.fail(f"stunnerd never got to {what}: {last}")


@pytest.fixture
def topo(tmp_path: Path) -> Iterator[Topology]:
    require_tool("bpftool")
    with netns.topology() as t:
        argv = t.argv(t.peer, require_tool("turnutils_peer"), "-L", PEER_IP, "-p", str(PEER_PORT))
        peer = ServerProcess(argv, log_path=tmp_path / "peer.log")
        try:
            yield t
        finally:
            peer.stop()


def start(topo: Topology, tmp_path: Path, name: str, *args: str) -> ServerProcess:
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(config()))
    argv = topo.argv(topo.server, STUNNERD, "-c", str(path), *args)
    return ServerProcess(argv, log_path=tmp_path / f"{name}.log")


def require_offload(topo: Topology, proc: ServerProcess) -> None:
    """Skip (never under CI=true) where the kernel offload cannot run."""
    current = wait(topo, "serving", lambda s: bool(s.get("listeners")))
    offload = current.get("offload", {})
    if offload.get("active"):
        return
    reason = f"eBPF offload unavailable: {offload.get('reason')}"
    proc.stop()
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the offload tests: {reason}")
    pytest.skip(reason)


def test_a_killed_worker_leaves_its_offloaded_channel_relaying(
    topo: Topology, tmp_path: Path
) -> None:
    dep = start(topo, tmp_path, "stunnerd", "--udp-thread-num", "2")
    require_offload(topo, dep)
    client = probe(topo, count=250)
    try:
        before = wait(
            topo,
            "kernel relaying",
            lambda s: s["offload"].get("channels") == 1 and s["offload"]["packets"] > 20,
        )
        victim = next(w for w in before["workers"] if w["allocations"] > 0)
        os.kill(int(victim["pid"]), signal.SIGKILL)
        index = before["workers"].index(victim)
        wait(
            topo,
            "the worker back with its allocation",
            lambda s: (
                s["workers"][index]["pid"] not in (None, victim["pid"])
                and s["workers"][index]["allocations"] == 1
                and s["offload"]["channels"] == 1
            ),
        )
        assert kernel_entries(topo) == 1
        result = probe_result(client)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        dep.stop()
    print(f"worker kill with offload: {result}")
    assert result["lost"] == 0, result
    assert result["rtt_p99_ms"] < SLOW_MS, result


@pytest.mark.parametrize("workers", ["0", "2"], ids=["one-process", "2-workers"])
def test_a_handoff_keeps_the_offloaded_channel_relaying_in_the_kernel(
    topo: Topology, tmp_path: Path, workers: str
) -> None:
    handoff = tmp_path / "handoff" / "stunnerd.sock"
    args = ("--handoff-socket", str(handoff), "--udp-thread-num", workers)
    old = start(topo, tmp_path, "old", *args)
    require_offload(topo, old)
    new: ServerProcess | None = None
    # 15 s of calls: on a loaded machine a successor with workers takes several seconds to
    # start, and a call that ended before it would leave nothing to hand over.
    client = probe(topo, count=750)
    try:
        wait(
            topo,
            "kernel relaying",
            lambda s: s["offload"].get("channels") == 1 and s["offload"]["packets"] > 20,
        )
        new = start(topo, tmp_path, "new", *args)
        assert old.proc.wait(WAIT_S) == 0
        after = wait(topo, "the successor relaying", lambda s: s["offload"]["channels"] == 1)
        assert after["offload"]["active"] is True
        assert kernel_entries(topo) == 1
        relayed = after["offload"]["packets"]
        wait(topo, "more kernel relaying", lambda s: s["offload"]["packets"] > relayed + 20)
        result = probe_result(client)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        if new is not None:
            new.stop()
        old.stop()
    print(f"handoff with offload ({workers} workers): {result}")
    assert result["lost"] == 0, result
    assert result["rtt_p99_ms"] < SLOW_MS, result
