"""stunnerd with `admin.offload_engine`, in network namespaces, against independent TURN clients.

The server namespace does not forward, the peer (coturn's turnutils_peer) lives in its own
namespace, and the clients (turnutils_uclient, aioice) in theirs. "Relayed by the kernel" is
checked with stunnerd's own counters: the cluster counters count every datagram relayed to or
from the peer by either path, the offload counters only what the BPF program relayed, so equal
figures mean user space relayed none of the channel traffic.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
REALM = "stunner.l7mp.io"
TCP_PORT = 3479
STATUS = "http://127.0.0.1:8086/status"
METRICS = "http://127.0.0.1:8080/metrics"
WAIT_S = 15.0


def config(
    engine: str, peers: tuple[str, ...] = (f"{PEER_IP}/32",), password: str = PASSWORD
) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {
            "name": "test/offload",
            "loglevel": "all:INFO",
            "healthcheck_endpoint": "http://0.0.0.0:8086",
            "metrics_endpoint": "http://0.0.0.0:8080/metrics",
            "offload_engine": engine,
        },
        "auth": {
            "type": "static",
            "realm": REALM,
            "credentials": {"username": USER, "password": password},
        },
        "listeners": [
            {
                "name": "test/udp",
                "protocol": "TURN-UDP",
                "address": SERVER_CLIENT_IP,
                "port": UDP_PORT,
                "routes": ["test/peers"],
            },
            {
                "name": "test/tcp",
                "protocol": "TURN-TCP",
                "address": SERVER_CLIENT_IP,
                "port": TCP_PORT,
                "routes": ["test/peers"],
            },
        ],
        "clusters": [{"name": "test/peers", "type": "STATIC", "endpoints": list(peers)}],
    }


@dataclass
class Deployment:
    topo: Topology
    path: Path
    proc: ServerProcess

    def write(
        self, engine: str, peers: tuple[str, ...] = (f"{PEER_IP}/32",), password: str = PASSWORD
    ) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config(engine, peers, password)))
        tmp.replace(self.path)

    def status(self) -> dict[str, Any]:
        text = netns.http_get(self.topo, self.topo.server, STATUS)
        return json.loads(text) if text.strip() else {}

    def offload(self) -> dict[str, Any]:
        return dict(self.status().get("offload", {}))

    def wait(self, what: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            status = self.status()
            if status and check(status):
                return status
            if not self.proc.alive():
                pytest.fail(f"stunnerd exited: {self.proc.output()[-2000:]}")
            time.sleep(0.1)
        pytest.fail(f"stunnerd never got to {what}: {self.status()}\n{self.proc.output()[-2000:]}")

    def cluster_packets(self) -> dict[str, int]:
        text = netns.http_get(self.topo, self.topo.server, METRICS)
        out = {"rx": 0, "tx": 0}
        for direction, value in re.findall(
            r'stunner_cluster_packets_total\{direction="(rx|tx)",name="test/peers"\} ([\d.e+]+)',
            text,
        ):
            out[direction] = int(float(value))
        return out


@pytest.fixture
def topo() -> Iterator[Topology]:
    with netns.topology() as t:
        yield t


@pytest.fixture
def peer(topo: Topology, tmp_path: Path) -> Iterator[None]:
    argv = topo.argv(topo.peer, require_tool("turnutils_peer"), "-L", PEER_IP, "-p", str(PEER_PORT))
    proc = ServerProcess(argv, log_path=tmp_path / "peer.log")
    yield
    proc.stop()


def start(topo: Topology, tmp_path: Path, engine: str, workers: int = 1) -> Deployment:
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(config(engine)))
    argv = topo.argv(topo.server, STUNNERD, "-c", str(path), "-w", "--udp-thread-num", str(workers))
    dep = Deployment(topo, path, ServerProcess(argv, log_path=tmp_path / "stunnerd.log"))
    try:
        dep.wait("serving", lambda s: bool(s.get("listeners")))
    except BaseException:
        dep.proc.stop()
        raise
    return dep


@pytest.fixture
def offloaded(topo: Topology, tmp_path: Path, peer: None) -> Iterator[Deployment]:
    dep = start(topo, tmp_path, "TC")
    yield dep
    dep.proc.stop()


def uclient(topo: Topology, *args: str) -> tuple[int, int]:
    argv = [
        require_tool("turnutils_uclient"), "-u", USER, "-w", PASSWORD, "-e", PEER_IP,
        "-r", str(PEER_PORT), "-X", *args, SERVER_CLIENT_IP,
    ]  # fmt: skip
    done = topo.run(topo.client, *argv, timeout_s=120)
    out = done.stdout + done.stderr
    totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$", out, re.M)
    assert totals, out[-3000:]
    sent, received = map(int, totals[-1])
    return sent, received


def test_uclient_channels_are_relayed_by_the_kernel(offloaded: Deployment) -> None:
    status = offloaded.offload()
    assert status["engine"] == "TC"
    assert status["active"] is True, status
    sent, received = uclient(offloaded.topo, "-c", "-m", "2", "-n", "50", "-z", "5", "-l", "160")
    assert sent == received == 100
    after = offloaded.offload()
    clusters = offloaded.cluster_packets()
    assert clusters == {"rx": 100, "tx": 100}
    assert after["packets"] == 200  # every one of them relayed by the kernel
    assert after["bytes"] == 200 * 160


def test_an_aioice_client_is_relayed_by_the_kernel_and_its_refresh_0_removes_the_entries(
    offloaded: Deployment,
) -> None:
    proc = probe(offloaded.topo, count=100, interval_ms=20)
    assert offloaded.offload()["channels"] == 1
    result = probe_result(proc)  # ends with Refresh lifetime 0
    assert result["received"] == result["sent"] == 100
    status = offloaded.wait("no channel", lambda s: s["offload"]["channels"] == 0)
    assert status["offload"]["packets"] == 2 * 101  # with the echo that checked the channel


def test_a_peer_removed_from_the_route_is_dropped_with_the_reconcile(offloaded: Deployment) -> None:
    proc = probe(offloaded.topo, count=200, interval_ms=20)
    try:
        offloaded.wait("one channel", lambda s: s["offload"]["channels"] == 1)
        offloaded.write("TC", peers=("10.77.3.0/24",))
        status = offloaded.wait(
            "the new route",
            lambda s: s["clusters"][0]["endpoints"] == ["10.77.3.0/24"],
        )
        assert status["offload"]["channels"] == 0
        before = offloaded.offload()["packets"]
        result = probe_result(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert result["received"] < result["sent"]
    assert offloaded.offload()["packets"] == before  # nothing relayed after the reconcile


def test_a_password_change_takes_the_channel_out_of_the_kernel_with_the_reconcile(
    offloaded: Deployment,
) -> None:
    proc = probe(offloaded.topo, count=200, interval_ms=20)
    try:
        offloaded.wait("kernel relaying", lambda s: s["offload"]["packets"] > 10)
        offloaded.write("TC", password="rotated")
        status = offloaded.wait("no channel", lambda s: s["offload"]["channels"] == 0)
        before = status["offload"]["packets"]
        result = probe_result(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # As upstream, the allocation relays until its next request fails, but in user space only.
    assert result["lost"] == 0, result
    assert offloaded.offload()["packets"] == before  # nothing relayed by the kernel after it
    assert offloaded.cluster_packets() == {"rx": 201, "tx": 201}


def test_send_indications_and_tcp_listeners_still_work(offloaded: Deployment) -> None:
    sent, received = uclient(offloaded.topo, "-s", "-c", "-n", "30", "-z", "5")
    assert sent == received == 30
    sent, received = uclient(offloaded.topo, "-t", "-p", str(TCP_PORT), "-c", "-n", "30", "-z", "5")
    assert sent == received == 30
    assert offloaded.offload()["packets"] == 0  # neither is ChannelData over TURN-UDP


def test_switching_the_engine_live_loses_no_packet(
    topo: Topology, tmp_path: Path, peer: None
) -> None:
    dep = start(topo, tmp_path, "None")
    try:
        assert dep.offload() == {
            "engine": "None",
            "active": False,
            "reason": "offload_engine is None",
        }
        proc = probe(topo, count=300, interval_ms=20)
        try:
            dep.write("TC")
            dep.wait("TC", lambda s: s["offload"].get("channels") == 1)
            dep.wait("kernel relaying", lambda s: s["offload"]["packets"] > 20)
            dep.write("None")
            dep.wait("None", lambda s: s["offload"]["active"] is False)
            result = probe_result(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert result["lost"] == 0, result
        assert result["duplicates"] == 0, result
        assert dep.cluster_packets() == {"rx": 301, "tx": 301}  # 300 + the binding probe
    finally:
        dep.proc.stop()


def test_two_worker_processes_share_one_program_and_a_dead_workers_entries_stay(
    topo: Topology, tmp_path: Path, peer: None
) -> None:
    require_tool("bpftool")
    dep = start(topo, tmp_path, "TC", workers=2)
    load = subprocess.Popen(
        topo.argv(
            topo.client, require_tool("turnutils_uclient"),
            "-u", USER, "-w", PASSWORD, "-e", PEER_IP,
            "-r", str(PEER_PORT), "-X", "-c", "-m", "16", "-n", "1500", "-z", "20", "-l", "160",
            SERVER_CLIENT_IP,
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # uclient's 16 sessions hold 32 allocations, with a channel each
        status = dep.wait(
            "32 channels over both workers, relaying",
            lambda s: (
                s["offload"].get("channels") == s["allocationCount"] == 32
                and s["offload"]["packets"] > 0
                and all(w["allocations"] > 0 for w in s["workers"])
            ),
        )
        assert kernel_entries(topo) == 32
        relayed = sum(status["clusters"][0]["stats"][d]["pkts"] for d in ("rx", "tx"))
        assert status["offload"]["packets"] == relayed > 0  # all of it by the kernel
        victim = status["workers"][0]
        os.kill(int(victim["pid"]), signal.SIGKILL)
        # The replacement adopts the dead worker's journaled allocations (crash recovery) and
        # writes their channels again: every kernel entry is still there.
        after = dep.wait(
            "the worker back with its allocations",
            lambda s: (
                s["workers"][0]["pid"] not in (None, victim["pid"])
                and s["workers"][0]["allocations"] == victim["allocations"]
                and s["offload"]["channels"] == 32
            ),
        )
        assert after["allocationCount"] == 32
        assert kernel_entries(topo) == 32
    finally:
        load.kill()
        load.wait()
        dep.proc.stop()


SERVER = str(Path(__file__).parents[2] / "support" / "offload_server.py")


class InProcess:
    """stunnerd's server in the server namespace, with the engine's clock in the test's hand."""

    def __init__(self, topo: Topology, path: Path) -> None:
        self.proc = subprocess.Popen(
            topo.python(topo.server, SERVER, str(path)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            pytest.fail(f"server did not start: {self.proc.communicate()[1][-2000:]}")

    def __call__(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.mark.parametrize(
    ("advance_s", "what"),
    [(301, "the permission expired"), (3601, "the allocation expired")],
)
def test_an_expiry_removes_the_kernel_entries_at_once(
    topo: Topology, tmp_path: Path, peer: None, advance_s: int, what: str
) -> None:
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(config("TC")))
    server = InProcess(topo, path)
    proc = probe(topo, count=150, interval_ms=20)
    try:
        before = server("status")
        assert before["offload"]["channels"] == 1
        assert before["entries"] == [1, 1]
        after = server(f"advance {advance_s}")
        assert after["offload"]["channels"] == 0, what
        assert after["entries"] == [0, 0], what
        relayed = after["offload"]["packets"]
        result = probe_result(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()
    assert result["received"] < result["sent"]  # the engine refuses the rest, so does the kernel
    assert relayed > 0
