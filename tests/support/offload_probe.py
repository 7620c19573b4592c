"""What the stunnerd offload interop tests share: a paced TURN probe through the namespaces'
server, its result, and the kernel's channel entries.

The probe (support/turn_probe.py, aioice) runs in the client namespace against the server's
TURN-UDP listener at SERVER_CLIENT_IP:3478 with the static user1/passwd1 credentials and echoes
through the peer namespace's turnutils_peer at PEER_IP:50000.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.netns import PEER_IP, SERVER_CLIENT_IP, Topology
from support.processes import which

PROBE = str(Path(__file__).with_name("turn_probe.py"))
USER, PASSWORD = "user1", "passwd1"
UDP_PORT, PEER_PORT = 3478, 50000


def require_tool(name: str) -> str:
    """The tool's path; the test is skipped where it is not installed."""
    binary = which(name)
    if binary is None:
        pytest.skip(f"{name} is not installed")
    return binary


def probe(topo: Topology, count: int, interval_ms: float = 20.0) -> subprocess.Popen[str]:
    """Start the probe; returns once it has its allocation and channel ("ready")."""
    proc = subprocess.Popen(
        topo.python(
            topo.client, PROBE, SERVER_CLIENT_IP, str(UDP_PORT), USER, PASSWORD, PEER_IP,
            str(PEER_PORT), "--count", str(count), "--interval-ms", str(interval_ms),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        pytest.fail(f"probe did not start: {line} {proc.communicate()[1][-2000:]}")
    return proc


def probe_result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The probe's last line: sent, received, round-trip times."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def kernel_entries(topo: Topology) -> int:
    """Entries in the client map of the program attached in the server namespace."""

    def run(*argv: str) -> Any:
        done = topo.run(topo.server, *argv)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    filters = run("tc", "-j", "filter", "show", "dev", topo.server_client_if, "ingress")
    prog = next(f["options"]["prog"]["id"] for f in filters if "prog" in f.get("options", {}))
    for map_id in run("bpftool", "-j", "prog", "show", "id", str(prog))["map_ids"]:
        if run("bpftool", "-j", "map", "show", "id", str(map_id))["name"] == "stunner_chan":
            return len(run("bpftool", "-j", "map", "dump", "id", str(map_id)))
    raise AssertionError("no stunner_chan map")
