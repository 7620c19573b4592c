"""stunnerd's health server: it binds where --bind says, /status names where it listens, and a
taken health port ends stunnerd with one clear line instead of leaving it unprobeable."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess

pytestmark = pytest.mark.integration

STUNNERD = str(Path(sys.executable).with_name("stunnerd"))


def turn_uri() -> str:
    return f"turn://user:pass@127.0.0.1:{free_udp_tcp_port()}?transport=udp"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(lambda: [turn_uri()], id="turn-uri"),
        pytest.param(lambda: ["-w", "-c", f"ws://127.0.0.1:{free_port()}"], id="cds-watch"),
    ],
)
def test_a_taken_health_port_ends_stunnerd_with_one_line(argv: object) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [STUNNERD, "--bind", "127.0.0.1", *argv()],  # type: ignore[operator]
            env={"STUNNERD_HEALTH_PORT": str(port), "PATH": ""},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("stunnerd:")]
    assert lines == [
        f"stunnerd: health server cannot listen on 127.0.0.1:{port}: Address already in use"
    ], result.stderr


def test_the_health_server_binds_the_bind_host_and_status_says_where(tmp_path: Path) -> None:
    port = free_port()
    proc = ServerProcess(
        [STUNNERD, "--bind", "127.0.0.1", turn_uri()],
        env={"STUNNERD_HEALTH_PORT": str(port), "PATH": ""},
        log_path=tmp_path / "stunnerd.log",
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
                    status = json.load(r)
                break
            except OSError:
                assert proc.alive(), proc.output()
                assert time.monotonic() < deadline, proc.output()
                time.sleep(0.1)
        assert status["admin"]["healthcheck_endpoint"] == f"http://127.0.0.1:{port}"
        # Another loopback address reaches a wildcard socket, not one bound to 127.0.0.1.
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.2", port))
    finally:
        proc.stop()
