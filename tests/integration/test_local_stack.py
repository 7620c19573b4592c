"""`make run`'s stack end to end: Redis with ACL users, operator on examples/local, CDS, auth
service, one stunnerd per Gateway, UDP echo. And a new user's first day with it: three
Gateways added, metrics turned on, a listener broken, a route to a Gateway that does not exist, a
client refused, a route deleted under a running turncat: each gets a working stunnerd or a clear
line in the terminal, and nothing that ran is torn down by a mistake.

The example manifests are copied with free ports so the test never collides with a running stack.
turncat sends a line through each Gateway to the echo backend; a Gateway added to the folder gets
its own stunnerd and one removed loses it; the auth service answers; `--stop` (what `make stop`
runs), SIGHUP (the terminal closing) and the runner's death each leave no child behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
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

from support.local_manifests import copy_local_examples
from support.ports import free_port, free_ports, free_udp_tcp_port
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
def local_stack(tmp_path: Path, **ports: int) -> Iterator[LocalStack]:
    udp_port, tcp_port = free_udp_tcp_port(), free_udp_tcp_port()
    manifests = copy_local_examples(tmp_path / "manifests", udp_port, tcp_port)
    echo_port, auth_port = free_port(socket.SOCK_DGRAM), ports.pop("auth_port", free_port())
    flags = {
        "--cds-port": free_port(),
        "--redis-port": free_port(),
        "--echo-port": echo_port,
        "--health-port": free_port(),
        "--operator-health-port": free_port(),
        "--operator-metrics-port": free_port(),
        "--media-port": free_port(),
        "--metrics-port": free_port(),
    }
    flags.update({f"--{name.replace('_', '-')}": port for name, port in ports.items()})
    argv = [
        str(BIN / "python"),
        str(ROOT / "scripts" / "run_local.py"),
        "--manifests",
        str(manifests),
        "--auth-port",
        str(auth_port),
        *(arg for flag, port in flags.items() for arg in (flag, str(port))),
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


BUSY_GATEWAY = """apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: {name}
  namespace: stunner
spec:
  gatewayClassName: stunner-gatewayclass
  addresses:
    - type: IPAddress
      value: 127.0.0.1
  listeners:
    - name: udp
      port: {port}
      protocol: TURN-UDP
---
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata:
  name: {name}-echo
  namespace: stunner
spec:
  parentRefs:
    - name: {name}
  rules:
    - backendRefs:
        - group: stunner.l7mp.io
          kind: StaticService
          name: local-echo
"""
LOST_ROUTE = """apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata:
  name: lost
  namespace: stunner
spec:
  parentRefs:
    - name: no-such-gateway
  rules:
    - backendRefs:
        - group: stunner.l7mp.io
          kind: StaticService
          name: local-echo
"""


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def test_a_users_first_day_ports_grow_mistakes_are_loud_and_refusals_are_logged(
    tmp_path: Path,
) -> None:
    # The collisions, staged: the auth service sits where the third stunnerd's health
    # port would be (8086 + 2 next to 8088), the operator's metrics where the first stunnerd's
    # metrics would be (8080 for both).
    health = free_ports(12)
    metrics = free_ports(12)
    with local_stack(
        tmp_path,
        health_port=health,
        auth_port=health + 2,
        metrics_port=metrics,
        operator_metrics_port=metrics,
    ) as stack:
        arg = dict(zip(stack.argv[:-1], stack.argv[1:], strict=True))
        cds = f"127.0.0.1:{arg['--cds-port']}"
        operator = f"127.0.0.1:{arg['--operator-health-port']}"
        ctl = [str(BIN / "stunnerctl"), "--cds", cds]
        wait_until(
            lambda: stack.ready("udp-gateway") and stack.ready("tcp-gateway"),
            "stunnerds",
            stack.proc,
        )
        udp = f"turn://user-1:pass-1@127.0.0.1:{stack.udp_port}?transport=udp"

        # A long-running turncat on udp-gateway: its allocation must live through every mistake.
        local = free_port(socket.SOCK_DGRAM)
        tc_err = (tmp_path / "turncat.err").open("wb")
        long_running = subprocess.Popen(
            [
                str(BIN / "turncat"),
                f"udp://127.0.0.1:{local}",
                udp,
                f"udp://127.0.0.1:{stack.echo_port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=tc_err,
            env={**os.environ, "TURNCAT_SILENCE_PROBE_S": "1"},
        )
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        client.settimeout(1)

        def echoes(data: bytes) -> bool:
            for _ in range(5):
                client.sendto(data, ("127.0.0.1", local))
                try:
                    if client.recv(2048) == data:
                        return True
                except TimeoutError:
                    continue
            return False

        try:
            wait_until(lambda: echoes(b"first"), "the long-running turncat", stack.proc, 30)

            # 1. Three Gateways more: each gets a working stunnerd, none on a taken port.
            extra = {f"extra-{i}": free_udp_tcp_port() for i in (1, 2, 3)}
            for name, port in extra.items():
                (stack.manifests / f"{name}.yaml").write_text(
                    BUSY_GATEWAY.format(name=name, port=port)
                )
            for name in extra:
                wait_until(lambda n=name: stack.ready(n), f"a stunnerd for {name}", stack.proc)
            for name, port in extra.items():
                uri = f"turn://user-1:pass-1@127.0.0.1:{port}?transport=udp"
                assert turncat_echo(uri, stack.echo_port, name.encode()) == name.encode()
            out = stack.proc.output()
            assert "cannot start" not in out, out
            health_ports = [
                int(p) for p in re.findall(r"health +http://127.0.0.1:(\d+)/ready", out)
            ]
            assert len(health_ports) == 5, out
            assert len(set(health_ports)) == 5
            assert health + 2 not in health_ports, "the auth service's port"
            status = subprocess.run(
                [*ctl, "status", "--health-port", str(health), "--operator", operator],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert status.returncode == 0, status.stdout + status.stderr
            assert status.stdout.count("status: READY") == 5, status.stdout

            # A Gateway whose listener port another program holds: said once, with the fix,
            # then started as soon as the port is free.
            holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            holder.bind(("127.0.0.1", 0))
            busy = holder.getsockname()[1]
            (stack.manifests / "busy.yaml").write_text(BUSY_GATEWAY.format(name="busy", port=busy))
            wait_until(
                lambda: "cannot start a stunnerd for stunner/busy" in stack.proc.output(),
                "the port problem",
                stack.proc,
            )
            time.sleep(3)  # several sync rounds
            lines = [ln for ln in stack.proc.output().splitlines() if "stunner/busy" in ln]
            assert len(lines) == 1, lines
            assert f"port {busy}/udp" in lines[0]
            assert (
                "in use by another program (free the port or change the listener's port" in lines[0]
            )
            holder.close()
            wait_until(lambda: stack.ready("busy"), "the busy Gateway once free", stack.proc)

            # 2. Metrics on in the Dataplane: every stunnerd serves them on a port of its own,
            # and the operator's metrics stay where they were.
            dataplane = stack.manifests / "dataplane.yaml"
            dataplane.write_text(
                dataplane.read_text().rstrip("\n") + "\n  enableMetricsEndpoint: true\n"
            )
            wait_until(
                lambda: (
                    len(re.findall(r"^stunnerd \S+ metrics: http", stack.proc.output(), re.M)) == 6
                ),
                "six metrics endpoints",
                stack.proc,
            )
            urls = re.findall(r"^stunnerd \S+ metrics: (http\S+)", stack.proc.output(), re.M)
            assert f"http://127.0.0.1:{metrics}/metrics" not in urls
            for url in urls:
                assert "stunner_allocations_active" in http_get(url), url
            assert "stunner_operator_renders" in http_get(f"http://127.0.0.1:{metrics}/metrics")

            # 3. A broken listener: the error in the terminal with the real cause; the Gateway
            # keeps its last good version and the live allocation; counted; degraded in status.
            gateways = stack.manifests / "gateways.yaml"
            good = gateways.read_text()
            gateways.write_text(good.replace("protocol: TURN-UDP", "protocol: TURN-FOO"))
            wait_until(
                lambda: (
                    "operator error: Gateway stunner/udp-gateway: listener udp-listener: "
                    "unsupported protocol 'TURN-FOO'" in stack.proc.output()
                ),
                "the operator's error in the terminal",
                stack.proc,
            )
            assert "allowedRoutes" not in stack.proc.output()
            assert echoes(b"still here"), "the live allocation survives the mistake"
            config = subprocess.run(
                [*ctl, "config", "stunner/udp-gateway"], capture_output=True, text=True, timeout=30
            )
            assert "Protocol: TURN-UDP" in config.stdout, config.stdout + config.stderr
            metrics_text = http_get(f"http://127.0.0.1:{metrics}/metrics")
            assert "stunner_operator_manifest_errors 1.0" in metrics_text
            status = subprocess.run(
                [
                    *ctl,
                    "status",
                    "stunner/udp-gateway",
                    "--health-port",
                    str(health),
                    "--operator",
                    operator,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert status.returncode == 1, status.stdout + status.stderr
            assert "Gateway: stunner/udp-gateway status: DEGRADED (stunnerd READY)" in status.stdout
            assert "! listener udp-listener: unsupported protocol 'TURN-FOO'" in status.stdout
            # A schema error next keeps the last GOOD version, of that object.
            gateways.write_text(
                good.replace("protocol: TURN-UDP", "protocol: TURN-FOO").replace(
                    f"port: {stack.udp_port}", "port: 70000"
                )
            )
            wait_until(
                lambda: (
                    "(keeping the last good version of Gateway stunner/udp-gateway)"
                    in stack.proc.output()
                ),
                "the schema error",
                stack.proc,
            )
            assert echoes(b"and still")
            gateways.write_text(good)

            # 4. A route to a Gateway that does not exist: a warning, and a --dry-run line.
            (stack.manifests / "lost.yaml").write_text(LOST_ROUTE)
            wait_until(
                lambda: (
                    "operator warning: UDPRoute stunner/lost: parent Gateway "
                    "stunner/no-such-gateway does not exist" in stack.proc.output()
                ),
                "the missing parent warning",
                stack.proc,
            )
            dry = subprocess.run(
                [str(BIN / "stunner-operator"), "--manifests", str(stack.manifests), "--dry-run"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert (
                "UDPRoute stunner/lost: parent Gateway stunner/no-such-gateway does not exist"
                in dry.stderr + dry.stdout
            )

            # 5. Refused clients: a wrong password and a peer no route admits, each logged once
            # with who, where and why, and counted by code.
            tcp = f"turn://user-1:wrong@127.0.0.1:{stack.tcp_port}?transport=tcp"
            bad = subprocess.run(
                [str(BIN / "turncat"), "-", tcp, f"udp://127.0.0.1:{stack.echo_port}"],
                input=b"x",
                capture_output=True,
                timeout=30,
                check=False,
            )
            assert bad.returncode == 3, bad.stderr
            tcp = f"turn://user-1:pass-1@127.0.0.1:{stack.tcp_port}?transport=tcp"
            forbidden = subprocess.run(
                [str(BIN / "turncat"), "-", tcp, f"udp://127.0.0.2:{stack.echo_port}"],
                input=b"x",
                capture_output=True,
                timeout=30,
                check=False,
            )
            assert forbidden.returncode == 4, forbidden.stderr
            log = stack.logs / "stunnerd-stunner-tcp-gateway.log"
            wait_until(
                lambda: log.read_text().count("stunnerd.refusals") >= 2,
                "refusal lines",
                stack.proc,
                10,
            )
            text = log.read_text()
            assert "refused ALLOCATE from 127.0.0.1:" in text
            assert "(user 'user-1'): 401 Unauthorized: wrong password" in text
            assert (
                f"403 Forbidden (peer not admitted by any route): peer 127.0.0.2:{stack.echo_port} "
                "is admitted by no route (routes considered: stunner/echo (UDP: 127.0.0.1))"
            ) in text
            counted = "".join(http_get(u) for u in urls)
            for code in (401, 403):
                series = f'{{code="{code}",name="stunner/tcp-gateway/tcp-listener"}} 1.0'
                assert f"stunner_listener_refusals_total{series}" in counted, counted

            # 6. /status counts the clients there are: the long-running one; a client that came
            # and left is not counted any more.
            def udp_listener() -> dict[str, object]:
                for port in health_ports:
                    doc = json.loads(http_get(f"http://127.0.0.1:{port}/status"))
                    if doc["admin"]["name"] == "stunner/udp-gateway":
                        return dict(doc["listeners"][0])
                raise AssertionError("no /status for stunner/udp-gateway")

            assert udp_listener()["connections"] == 1
            assert turncat_echo(udp, stack.echo_port, b"come and go") == b"come and go"
            wait_until(
                lambda: udp_listener()["connections"] == 1, "the client gone", stack.proc, 15
            )
            assert udp_listener()["allocations"] == 1

            # ... and a deleted route under the long-running turncat is reported, not silent.
            (stack.manifests / "route.yaml").unlink()
            deadline = time.monotonic() + 30
            while b"no route admits it any more" not in (tmp_path / "turncat.err").read_bytes():
                assert time.monotonic() < deadline, (tmp_path / "turncat.err").read_text()
                client.sendto(b"anyone?", ("127.0.0.1", local))
                time.sleep(0.5)
        finally:
            client.close()
            long_running.terminate()
            long_running.wait(10)
            tc_err.close()


def test_a_process_that_exits_is_named_with_the_end_of_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `make run` prints when a process of the stack dies: its name, the last lines of its
    # log (where the reason is, most of the time: a port in use, a bad config) and the log's path.
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("run_local", ROOT / "scripts" / "run_local.py")
    assert spec
    assert spec.loader
    run_local = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_local", run_local)
    spec.loader.exec_module(run_local)
    lines = [f"line {i}" for i in range(40)] + ["OSError: [Errno 98] Address already in use"]
    (tmp_path / "stunnerd-stunner-a.log").write_text("\n".join(lines) + "\n")
    message = run_local.exited_message(tmp_path, "stunnerd-stunner-a")
    assert message.startswith(f"stunnerd-stunner-a exited: see {tmp_path}/stunnerd-stunner-a.log")
    assert message.endswith("  | OSError: [Errno 98] Address already in use")
    assert "line 25" not in message
    assert "line 26" in message
    assert run_local.exited_message(tmp_path, "never-started").endswith("never-started.log")
