"""`make run`'s stack end to end: Redis with ACL users, operator on examples/local, CDS, auth
service, one stunnerd per Gateway, UDP echo.

The example manifests are copied with free ports so the test never collides with a running stack.
turncat sends a line through each Gateway to the echo backend; a Gateway added to the folder gets
its own stunnerd and one removed loses it; the auth service answers; `--stop` (what `make stop`
runs), SIGHUP (the terminal closing) and the runner's death each leave no child behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXTRA_GATEWAY = """apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: extra-gateway
  namespace: stunner
spec:
  gatewayClassName: stunner-gatewayclass
  addresses:
    - type: IPAddress
      value: 127.0.0.1
  listeners:
    - name: extra-listener
      port: {port}
      protocol: TURN-UDP
---
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata:
  name: extra-echo
  namespace: stunner
spec:
  parentRefs:
    - name: extra-gateway
  rules:
    - backendRefs:
        - group: stunner.l7mp.io
          kind: StaticService
          name: local-echo
"""


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


def fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bytes(resp.read())
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie awaiting its reaper counts as gone.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False


def wait_until(check: object, what: str, stack: ServerProcess, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{stack.output()}"
        time.sleep(0.1)


@dataclass
class LocalStack:
    proc: ServerProcess
    manifests: Path
    rundir: Path
    udp_port: int
    tcp_port: int
    echo_port: int
    auth_port: int
    argv: list[str]

    @property
    def logs(self) -> Path:
        return self.rundir / "latest"

    def child_pids(self) -> dict[str, int]:
        return {
            m[0]: int(m[1]) for m in re.findall(r"started (\S+)\s+pid (\d+)", self.proc.output())
        }

    def ready(self, gw: str) -> bool:
        log = self.logs / f"stunnerd-stunner-{gw}.log"
        return log.exists() and "ready on port" in log.read_text(errors="replace")


@contextlib.contextmanager
def local_stack(tmp_path: Path) -> Iterator[LocalStack]:
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
    echo_port, auth_port = free_port(socket.SOCK_DGRAM), free_port()
    argv = [
        str(BIN / "python"),
        str(ROOT / "scripts" / "run_local.py"),
        "--manifests",
        str(manifests),
        "--cds-port",
        str(free_port()),
        "--auth-port",
        str(auth_port),
        "--redis-port",
        str(free_port()),
        "--echo-port",
        str(echo_port),
        "--health-port",
        str(free_port()),
        "--operator-health-port",
        str(free_port()),
        "--operator-metrics-port",
        str(free_port()),
        "--media-port",
        str(free_port()),
        "--rundir",
        str(tmp_path / "run"),
    ]
    proc = ServerProcess(argv, log_path=tmp_path / "stack.log")
    stack = LocalStack(
        proc, manifests, tmp_path / "run", udp_port, tcp_port, echo_port, auth_port, argv
    )
    try:
        wait_until(lambda: "Gateways:" in proc.output(), "the stack to start", proc)
        yield stack
    finally:
        proc.stop()


def test_the_local_stack_relays_follows_the_manifests_and_stops_cleanly(tmp_path: Path) -> None:
    with local_stack(tmp_path) as stack:
        out = stack.proc.output()
        for row in (
            "TURN stunner/udp-gateway",
            "stunnerd stunner/tcp-gateway health",
            "CDS",
            "auth service",
            "browser call (WebRTC echo)",
            "logs",
        ):
            assert row in out, out
        wait_until(
            lambda: stack.ready("udp-gateway") and stack.ready("tcp-gateway"),
            "both stunnerds",
            stack.proc,
        )
        udp = f"turn://user-1:pass-1@127.0.0.1:{stack.udp_port}?transport=udp"
        tcp = f"turn://user-1:pass-1@127.0.0.1:{stack.tcp_port}?transport=tcp"
        assert turncat_echo(udp, stack.echo_port, b"through udp\n") == b"through udp\n"
        assert turncat_echo(tcp, stack.echo_port, b"through tcp\n") == b"through tcp\n"

        # stunnerctl finds every Gateway's stunnerd on the health ports make run hands out.
        def arg(flag: str) -> str:
            return stack.argv[stack.argv.index(flag) + 1]

        ctl = [str(BIN / "stunnerctl"), "--cds", f"127.0.0.1:{arg('--cds-port')}"]
        status = subprocess.run(
            [*ctl, "status", "--health-port", arg("--health-port")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        assert re.findall(r"^Gateway: (\S+) status: READY", status.stdout, re.M) == [
            "stunner/tcp-gateway",
            "stunner/udp-gateway",
        ]
        icetest = subprocess.run(
            [*ctl, "icetest", "--peer", f"udp://127.0.0.1:{stack.echo_port}", "-c", "5"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert icetest.returncode == 0, icetest.stdout + icetest.stderr
        assert icetest.stdout.count("sent 5, received 5, loss 0.0%") == 2, icetest.stdout

        url = f"http://127.0.0.1:{stack.auth_port}/?service=turn&gateway=udp-gateway"
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.read().startswith(b'{"username":"user-1","password":"pass-1"')
        page = f"http://127.0.0.1:{arg('--media-port')}/"  # tests/interop/browser makes the call
        wait_until(lambda: b"STUNner media echo" in fetch(page), "the call's page", stack.proc)

        # The Redis passwords are per run and stay out of every log.
        conf = (stack.logs / "redis.conf").read_text()
        assert oct((stack.logs / "redis.conf").stat().st_mode & 0o777) == "0o600"
        passwords = re.findall(r" >(\S+)", conf)
        assert len(passwords) == 2
        for log in stack.logs.glob("*.log"):
            assert not any(p in log.read_text(errors="replace") for p in passwords), log

        extra_port = free_udp_tcp_port()
        (stack.manifests / "extra.yaml").write_text(EXTRA_GATEWAY.format(port=extra_port))
        wait_until(
            lambda: stack.ready("extra-gateway"), "a stunnerd for the new Gateway", stack.proc
        )
        extra = f"turn://user-1:pass-1@127.0.0.1:{extra_port}?transport=udp"
        assert turncat_echo(extra, stack.echo_port, b"new gateway\n") == b"new gateway\n"
        extra_pid = stack.child_pids()["stunnerd-stunner-extra-gateway"]
        (stack.manifests / "extra.yaml").unlink()
        wait_until(
            lambda: not alive(extra_pid), "the removed Gateway's stunnerd to stop", stack.proc
        )
        wait_until(
            lambda: "Gateway stunner/extra-gateway left the manifests" in stack.proc.output(),
            "the runner to report the removed Gateway",
            stack.proc,
            timeout_s=10,
        )

        children = stack.child_pids()
        stop = subprocess.run([*stack.argv, "--stop"], capture_output=True, text=True, timeout=30)
        assert stop.returncode == 0, stop.stderr
        assert "stopped the local stack" in stop.stdout
        assert stack.proc.proc.wait(10) == 0
        assert [name for name, pid in children.items() if alive(pid)] == []


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL])
def test_closing_the_terminal_or_killing_the_runner_leaves_no_child(
    tmp_path: Path, sig: signal.Signals
) -> None:
    with local_stack(tmp_path) as stack:
        children = stack.child_pids()
        assert {"redis", "stunner-cds", "stunner-operator", "stunner-auth", "udp-echo"} <= set(
            children
        )
        os.kill(stack.proc.pid, sig)
        stack.proc.proc.wait(15)
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in children.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [name for name, pid in children.items() if alive(pid)] == []


def test_a_port_in_use_is_named_and_nothing_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [
                str(BIN / "python"),
                str(ROOT / "scripts" / "run_local.py"),
                "--cds-port",
                str(port),
                "--rundir",
                str(tmp_path / "run"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 1
    assert f"port {port}/tcp (CDS) is already in use" in result.stderr
    assert "Starting" not in result.stdout
    assert not (tmp_path / "run").exists()
