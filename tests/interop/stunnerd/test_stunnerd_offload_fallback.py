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
from fixtures.stunnerd.harness import PASSWORD, REALM, USER

from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess, which

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

STUNNERD = str(Path(sys.executable).with_name("stunnerd"))


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def test_an_offload_that_cannot_load_is_reported_and_the_relay_keeps_working(
    tmp_path: Path, udp_echo_peer: int
) -> None:
    uclient = which("turnutils_uclient")
    if uclient is None:
        pytest.skip("turnutils_uclient (coturn) is not installed")
    port, health = free_udp_tcp_port(), free_port()
    cfg = {
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
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(cfg))
    missing = tmp_path / "no-such.bpf.o"
    env = {**os.environ, "STUNNERD_OFFLOAD_OBJECT": str(missing)}
    proc = ServerProcess(
        [STUNNERD, "-c", str(path), "--bind", "127.0.0.1"],
        env=env,
        log_path=tmp_path / "stunnerd.log",
    )
    try:
        deadline = time.monotonic() + 15
        status: dict[str, Any] = {}
        while time.monotonic() < deadline and not status.get("listeners"):
            try:
                status = _status(health)
            except OSError:
                time.sleep(0.1)
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
