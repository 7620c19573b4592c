"""`make run`'s stack end to end: embedded Redis, operator on examples/local, CDS, stunnerd, echo.

The example manifests are copied with free ports so the test never collides with a running stack,
then turncat sends a line through each Gateway to the UDP echo backend and must get it back.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def turncat_echo(server_uri: str, echo_port: int, line: bytes) -> bytes:
    result = subprocess.run(
        [str(BIN / "turncat"), "-", server_uri, f"udp://127.0.0.1:{echo_port}"],
        input=line,
        capture_output=True,
        timeout=15,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def test_the_local_stack_relays_to_the_echo_backend_through_both_gateways(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    shutil.copytree(ROOT / "examples" / "local", manifests)
    udp_port, tcp_port = free_udp_tcp_port(), free_udp_tcp_port()
    gateways = manifests / "gateways.yaml"
    text = gateways.read_text()
    assert "port: 3478" in text
    assert "port: 3479" in text
    gateways.write_text(
        text.replace("port: 3478", f"port: {udp_port}").replace("port: 3479", f"port: {tcp_port}")
    )
    echo_port = free_port()
    argv = [
        str(BIN / "python"),
        str(ROOT / "scripts" / "run_local.py"),
        "--manifests",
        str(manifests),
        "--cds-port",
        str(free_port()),
        "--redis-port",
        str(free_port()),
        "--echo-port",
        str(echo_port),
        "--health-port",
        str(free_port()),
        "--rundir",
        str(tmp_path / "run"),
    ]
    stack = ServerProcess(argv, log_path=tmp_path / "stack.log")
    try:
        deadline = time.monotonic() + 60
        while "Gateways:" not in stack.output():
            assert stack.alive(), stack.output()
            assert time.monotonic() < deadline, stack.output()
            time.sleep(0.1)
        assert "stunner/udp-gateway" in stack.output()
        # Ready lines tell when each stunnerd has its listener up.
        logs = tmp_path / "run"
        while (
            not all(
                "ready on port" in (logs / f"stunnerd-stunner-{gw}.log").read_text(errors="replace")
                for gw in ("udp-gateway", "tcp-gateway")
                if (logs / f"stunnerd-stunner-{gw}.log").exists()
            )
            or len(list(logs.glob("stunnerd-*.log"))) < 2
        ):
            assert time.monotonic() < deadline, stack.output()
            time.sleep(0.1)
        udp = f"turn://user-1:pass-1@127.0.0.1:{udp_port}?transport=udp"
        tcp = f"turn://user-1:pass-1@127.0.0.1:{tcp_port}?transport=tcp"
        assert (
            turncat_echo(udp, echo_port, b"through the udp gateway\n")
            == b"through the udp gateway\n"
        )
        assert (
            turncat_echo(tcp, echo_port, b"through the tcp gateway\n")
            == b"through the tcp gateway\n"
        )
    finally:
        stack.stop()
    assert "Stopping the stack" in stack.output()
