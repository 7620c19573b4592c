"""Never worse than off: an offload engine that cannot start leaves the relay in user space.

The offload object is pointed at a file that does not exist, so nothing is ever loaded or
attached (this test runs in the host's own namespace, on loopback). stunnerd must say why in one
warning and in `/status`, and relay as if the engine were `None`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess, which
from support.stunnerd_process import PASSWORD, REALM, USER

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

STUNNERD = str(Path(sys.executable).with_name("stunnerd"))


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def _config(port: int, health: int) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {
            "name": "test/fallback",
            "healthcheck_endpoint": f"http://127.0.0.1:{health}",
            "offload_engine": "TC",
        },
        "auth": {
            "type": "static",
            "realm": REALM,
            "credentials": {"username": USER, "password": PASSWORD},
        },
        "listeners": [
            {
                "name": "test/udp",
                "protocol": "TURN-UDP",
                "address": "127.0.0.1",
                "port": port,
                "routes": ["test/loopback"],
            }
        ],
        "clusters": [{"name": "test/loopback", "type": "STATIC", "endpoints": ["127.0.0.0/8"]}],
    }


def _start(tmp_path: Path, *args: str) -> tuple[ServerProcess, int, int]:
    """stunnerd, offload_engine TC, an offload object that does not exist: (proc, port, health)."""
    port, health = free_udp_tcp_port(), free_port()
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(_config(port, health)))
    env = {**os.environ, "STUNNERD_OFFLOAD_OBJECT": str(tmp_path / "no-such.bpf.o")}
    proc = ServerProcess(
        [STUNNERD, "-c", str(path), "--bind", "127.0.0.1", *args],
        env=env,
        log_path=tmp_path / "stunnerd.log",
    )
    return proc, port, health


def _wait_status(proc: ServerProcess, health: int) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    status: dict[str, Any] = {}
    while time.monotonic() < deadline and not status.get("listeners"):
        if not proc.alive():
            pytest.fail(f"stunnerd exited: {proc.output()[-2000:]}")
        try:
            status = _status(health)
        except OSError:
            time.sleep(0.1)
    return status


def test_an_offload_that_cannot_load_is_reported_and_the_relay_keeps_working(
    tmp_path: Path, udp_echo_peer: int
) -> None:
    uclient = which("turnutils_uclient")
    if uclient is None:
        pytest.skip("turnutils_uclient (coturn) is not installed")
    proc, port, health = _start(tmp_path)
    try:
        status = _wait_status(proc, health)
        assert status.get("offload", {}).get("active") is False, status
        assert status["offload"]["engine"] == "TC"
        assert "no-such.bpf.o is missing" in status["offload"]["reason"]
        done = subprocess.run(
            [uclient, "-u", USER, "-w", PASSWORD, "-e", "127.0.0.1", "-r", str(udp_echo_peer),
             "-X", "-c", "-n", "20", "-z", "5", "-p", str(port), "127.0.0.1"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$", done.stdout, re.M)
        assert totals, done.stdout[-2000:]
        assert totals[-1] == ("20", "20")
    finally:
        proc.stop()
    warnings = [line for line in proc.output().splitlines() if "offload" in line.lower()]
    assert len([w for w in warnings if "WARNING" in w]) == 1, warnings
    assert "no-such.bpf.o is missing" in warnings[0]


def test_with_worker_processes_the_supervisors_reason_is_shown(tmp_path: Path) -> None:
    proc, _port, health = _start(tmp_path, "--udp-thread-num", "2")
    try:
        status = _wait_status(proc, health)
    finally:
        proc.stop()
    offload = status["offload"]
    assert (offload["engine"], offload["active"]) == ("TC", False), offload
    assert "no-such.bpf.o is missing" in offload["reason"]
