"""TURN relay cost: stunnerd (one process) against coturn 4.6 (one relay thread), same load.

Both servers face the same generator, coturn's `turnutils_uclient` with ChannelData flooding 100-B
messages (`-m 10 -c -z 0 -l 100`) to `turnutils_peer`, as coturn's own benchmark does (its
README.turnutils). The figure of merit is server CPU per relayed packet (utime+stime of the server's
process tree from /proc, before and after, divided by 2x echoed messages since every round trip is
forwarded twice). Runs alternate coturn / stunnerd so drift hits both. A second scenario measures
allocations: many short sessions (`-m 100 -n 1`), reported as server CPU per allocation and
allocations per second; a paced media-like load and a Send/Data indication flood complete the
picture. Upstream STUNner's stunnerd (Go, v1.2.1, user space; bench/upstream_peer.py) runs beside
them, with `--udp-thread-num` 1 and one thread per core, and each of our modes gets a `RATIO
cpu_per_packet ours/upstream` line per load. Everything binds 127.0.0.1; every run is bounded in
messages and in time.

`BENCH_TURN_PART=relay|storm|all` (default all) picks a part. The storm part (bench/alloc_storm.py)
makes `BENCH_TURN_STORM_ALLOCATIONS` allocations (2000; the issue's full size is 10000) from
`BENCH_TURN_STORM_CLIENTS` clients (50; full: 200) as fast as each server answers, against our
stunnerd (one process, and `--udp-thread-num 2` with and without the workers' allocation journal),
upstream's stunnerd and coturn, one server at a time on a fresh process, then once more against
ours under cProfile to say where its CPU per Allocate goes. All clients share 127.0.0.1, so our
per-source challenge budget (`STUNNERD_CHALLENGE_RATE_PER_S`, which stands for many real sources)
is lifted in the storm.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.fds import room_for_fds

USER, PASSWORD, REALM = "user1", "passwd1", "stunner.l7mp.io"
SESSIONS = 10
MESSAGES = int(os.environ.get("BENCH_TURN_MESSAGES", "20000"))  # per session
ROUNDS = int(os.environ.get("BENCH_TURN_ROUNDS", "3"))
ALLOC_SESSIONS = 100
RUN_TIMEOUT_S = 180.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                t.bind(("127.0.0.1", port))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


def tree_pids(pid: int) -> list[int]:
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            pids.extend(tree_pids(int(child)))
    return pids


def cpu_seconds(pid: int) -> float:
    """utime+stime of pid and its live descendants, in seconds."""
    total = 0
    for p in tree_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)
    return total / CLK_TCK


@dataclass
class Run:
    server: str
    round_trips: int
    sent: int
    lost_pct: float
    wall_s: float
    cpu_s: float

    @property
    def us_per_packet(self) -> float:
        return self.cpu_s * 1e6 / max(1, 2 * self.round_trips)

    @property
    def rt_per_s(self) -> float:
        return self.round_trips / self.wall_s if self.wall_s else 0.0


@contextmanager
def process(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def wait_udp_listening(
    port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 15.0
) -> None:
    """Wait until a Binding request to the port is answered."""
    request = b"\x00\x01\x00\x00\x21\x12\xa4\x42" + os.urandom(12)
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.2)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
            s.sendto(request, ("127.0.0.1", port))
            try:
                s.recvfrom(2048)
                return
            except OSError:
                continue
    raise TimeoutError(f"server on {port} did not answer: {log.read_text()[-2000:]}")


def uclient(port: int, peer_port: int, extra: list[str]) -> tuple[str, float]:
    argv = [
        "turnutils_uclient", "-p", str(port), "-u", USER, "-w", PASSWORD,
        "-e", "127.0.0.1", "-r", str(peer_port), "-X", *extra, "127.0.0.1",
    ]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    return done.stdout + done.stderr, time.monotonic() - start


def parse_uclient(output: str) -> tuple[int, int, float]:
    totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$", output, re.M)
    lost = re.search(r"Total lost packets \d+ \(([\d.]+)%\)", output)
    if not totals:
        raise RuntimeError(f"uclient printed no totals:\n{output[-2000:]}")
    sent, received = map(int, totals[-1])
    return sent, received, float(lost.group(1)) if lost else float("nan")


INDICATION_MESSAGES = 5000
PACED_SESSIONS = 40
PACED_INTERVAL_MS = 10
PACED_MESSAGES = 500


def flood(name: str, pid: int, port: int, peer_port: int, args: list[str] | None = None) -> Run:
    if args is None:
        args = ["-m", str(SESSIONS), "-c", "-z", "0", "-n", str(MESSAGES), "-l", "100"]
    for attempt in range(2):
        before = cpu_seconds(pid)
        output, wall = uclient(port, peer_port, args)
        cpu = cpu_seconds(pid) - before
        try:
            sent, received, lost = parse_uclient(output)
        except RuntimeError:
            # A session whose random local port meets an allocation an earlier run left behind
            # is refused (a channel of the same number to another peer: 400), and uclient stops.
            if attempt:
                raise
            print(f"{name}: uclient stopped early, run again: {output.strip()[-200:]}")
            continue
        break
    transmit = re.search(r"Total transmit time is (\d+)", output)
    wall_s = float(transmit.group(1)) if transmit and int(transmit.group(1)) > 0 else wall
    return Run(name, received, sent, lost, wall_s, cpu)


def allocations(pid: int, port: int, peer_port: int) -> tuple[float, float]:
    """(server CPU ms per allocation, allocations per second) for many one-message sessions."""
    for attempt in range(2):
        before = cpu_seconds(pid)
        args = ["-m", str(ALLOC_SESSIONS), "-c", "-n", "1", "-z", "0"]
        output, wall = uclient(port, peer_port, args)
        cpu = cpu_seconds(pid) - before
        try:
            parse_uclient(output)
        except RuntimeError:
            if attempt:
                raise
            print(f"allocations: uclient stopped early, run again: {output.strip()[-200:]}")
            continue
        break
    return cpu * 1e3 / ALLOC_SESSIONS, ALLOC_SESSIONS / wall


def stunnerd_config(port: int, protocol: str = "TURN-UDP") -> dict[str, object]:
    """One listener on 127.0.0.1:port with static credentials, routed to all of 127.0.0.0/8."""
    name = "bench/" + protocol.removeprefix("TURN-").lower()
    return {
        "version": "v1",
        "admin": {"name": "bench/stunnerd", "loglevel": "all:WARN", "healthcheck_endpoint": ""},
        "auth": {"type": "static", "realm": REALM,
                 "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [{"name": name, "protocol": protocol, "address": "127.0.0.1",
                       "port": port, "routes": ["bench/loopback"]}],
        "clusters": [{"name": "bench/loopback", "type": "STATIC", "endpoints": ["127.0.0.0/8"]}],
    }  # fmt: skip


def coturn_args(turnserver: str, port: int, tmp: Path, min_port: int = 50000) -> list[str]:
    """coturn on 127.0.0.1:port with one relay thread, the same user, relays from min_port on."""
    return [
        turnserver, "-n", "--no-cli", "--no-tls", "--no-dtls", "--log-file=stdout",
        "--simple-log", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
        f"--listening-port={port}", f"--min-port={min_port}", f"--max-port={min_port + 999}",
        "--allow-loopback-peers", "--lt-cred-mech", f"--user={USER}:{PASSWORD}",
        f"--realm={REALM}", "--fingerprint", "--relay-threads=1",
        f"--db={tmp / 'turndb'}", f"--pidfile={tmp / 'turnserver.pid'}",
    ]  # fmt: skip


@contextmanager
def start_upstreams(tmp: Path) -> Iterator[dict[str, tuple[int, int]]]:
    """Upstream stunnerd (Go) with 1 and with one UDP thread per core: ``{label: (pid, port)}``."""
    from bench import upstream_peer

    binary, why = upstream_peer.upstream_stunnerd()
    if binary is None:
        print(f"upstream stunnerd: {why}; raced without it")
        yield {}
        return
    out: dict[str, tuple[int, int]] = {}
    with ExitStack() as stack:
        for threads in upstream_peer.thread_counts():
            port = free_port()
            path = tmp / f"upstream-{threads}.json"
            path.write_text(json.dumps(stunnerd_config(port)))
            log = tmp / f"upstream-{threads}.log"
            proc = stack.enter_context(process(upstream_peer.argv(binary, path, threads), log))
            wait_udp_listening(port, proc, log)
            out[upstream_peer.label(threads)] = (proc.pid, port)
        yield out


def ours_vs_upstream(load: str, per_packet: dict[str, float]) -> None:
    """``RATIO <load> cpu_per_packet ours/upstream`` for each of our modes against each upstream."""
    prefix = f"{load} " if load else ""
    for ours, mode in (("stunnerd", "user space"), ("no-gso", "user space, no UDP GSO")):
        for name, theirs in per_packet.items():
            if not name.startswith("upstream") or ours not in per_packet:
                continue
            threads = name.removeprefix("upstream x")
            print(
                f"RATIO {prefix}cpu_per_packet ours/upstream = {per_packet[ours] / theirs:.2f}  "
                f"(ours: {mode}; upstream: stunnerd v1.2.1 --udp-thread-num {threads})"
            )


@dataclass
class Results:
    """Every scenario's runs, per server."""

    alloc: dict[str, tuple[float, float]]
    runs: dict[str, list[Run]]
    paced_runs: dict[str, list[Run]]
    indications: dict[str, Run]


def measure(turnserver: str, stunnerd: str) -> Results:
    """Start coturn, our stunnerd (with and without GSO) and upstream's; run every scenario."""
    with tempfile.TemporaryDirectory(prefix="bench-turn-") as tmp_name:
        tmp = Path(tmp_name)
        peer_port, coturn_port = free_port(), free_port()
        stunnerd_port, plain_port = free_port(), free_port()
        cfg = tmp / "stunnerd.json"
        cfg.write_text(json.dumps(stunnerd_config(stunnerd_port)))
        plain_cfg = tmp / "stunnerd-plain.json"
        plain_cfg.write_text(json.dumps(stunnerd_config(plain_port)))
        plain_env = {**os.environ, "STUNNERD_UDP_GSO": "0"}
        coturn_argv = coturn_args(turnserver, coturn_port, tmp)
        with (
            ExitStack() as stack,
            process(["turnutils_peer", "-L", "127.0.0.1", "-p", str(peer_port)], tmp / "peer.log"),
            process(coturn_argv, tmp / "coturn.log") as coturn,
            process([stunnerd, "-c", str(cfg), "--bind", "127.0.0.1"], tmp / "sd.log") as sd,
            process(
                [stunnerd, "-c", str(plain_cfg), "--bind", "127.0.0.1"],
                tmp / "sd-plain.log",
                env=plain_env,
            ) as plain,
        ):
            wait_udp_listening(coturn_port, coturn, tmp / "coturn.log")
            wait_udp_listening(stunnerd_port, sd, tmp / "sd.log")
            wait_udp_listening(plain_port, plain, tmp / "sd-plain.log")
            servers = {
                "coturn": (coturn.pid, coturn_port),
                "stunnerd": (sd.pid, stunnerd_port),
                "no-gso": (plain.pid, plain_port),
            }
            upstreams = stack.enter_context(start_upstreams(tmp))
            servers.update(upstreams)
            # Many one-message sessions first: uclient leaves its allocations behind, and a new
            # session whose random local port meets one of an earlier run's is refused (437/400),
            # so this scenario runs while the servers hold the fewest leftovers.
            alloc = {
                name: allocations(pid, port, peer_port) for name, (pid, port) in servers.items()
            }
            for _pid, port in servers.values():  # warm-up, discarded
                uclient(port, peer_port, ["-m", "2", "-c", "-z", "0", "-n", "2000", "-l", "100"])
            runs: dict[str, list[Run]] = {name: [] for name in servers}
            for _ in range(ROUNDS):
                for name, (pid, port) in servers.items():
                    runs[name].append(flood(name, pid, port, peer_port))
            paced_args = [
                "-m", str(PACED_SESSIONS), "-c", "-z", str(PACED_INTERVAL_MS),
                "-n", str(PACED_MESSAGES), "-l", "100",
            ]  # fmt: skip
            paced_runs: dict[str, list[Run]] = {name: [] for name in servers}
            for _ in range(ROUNDS):
                for name, (pid, port) in servers.items():
                    paced_runs[name].append(flood(name, pid, port, peer_port, paced_args))
            indication_args = [
                "-s", "-m", str(SESSIONS), "-c", "-z", "0", "-n", str(INDICATION_MESSAGES),
                "-l", "100",
            ]  # fmt: skip
            indications = {
                name: flood(name, pid, port, peer_port, indication_args)
                for name, (pid, port) in servers.items()
                if name != "no-gso"
            }
    return Results(alloc, runs, paced_runs, indications)


def print_runs(series: Iterable[Run], name: str) -> None:
    for r in series:
        print(
            f"{name:<9} {r.round_trips:>11} {r.lost_pct:>7.3f} {r.rt_per_s:>9.0f} "
            f"{r.cpu_s:>7.2f} {r.us_per_packet:>7.2f}"
        )


def report(results: Results) -> None:
    alloc, runs = results.alloc, results.runs
    paced_runs, indications = results.paced_runs, results.indications
    print(
        f"ChannelData flood: uclient -m {SESSIONS} -c -z 0 -l 100 -n {MESSAGES}, "
        f"{ROUNDS} alternating rounds"
    )
    print(f"{'server':<9} {'round trips':>11} {'loss %':>7} {'rt/s':>9} {'CPU s':>7} {'µs/pkt':>7}")
    for name, series in runs.items():
        print_runs(series, name)
    med = {name: statistics.median(r.us_per_packet for r in s) for name, s in runs.items()}
    rate = {name: statistics.median(r.rt_per_s for r in s) for name, s in runs.items()}
    print(
        f"median µs CPU per relayed packet: coturn {med['coturn']:.2f}, "
        f"stunnerd {med['stunnerd']:.2f}, stunnerd without UDP GSO batching {med['no-gso']:.2f}"
    )
    print(f"RATIO cpu_per_packet stunnerd/coturn = {med['stunnerd'] / med['coturn']:.2f}")
    print(f"RATIO cpu_per_packet stunnerd(no GSO)/coturn = {med['no-gso'] / med['coturn']:.2f}")
    print(f"RATIO round_trips_per_s stunnerd/coturn = {rate['stunnerd'] / rate['coturn']:.2f}")
    ours_vs_upstream("", med)
    per_s = PACED_SESSIONS * 1000 // PACED_INTERVAL_MS
    print(
        f"paced media-like load: uclient -m {PACED_SESSIONS} -c -z {PACED_INTERVAL_MS} -l 100 "
        f"-n {PACED_MESSAGES} (about {per_s} round trips/s, little to batch)"
    )
    for name, series in paced_runs.items():
        print_runs(series, name)
    paced = {n: statistics.median(r.us_per_packet for r in s) for n, s in paced_runs.items()}
    paced_ratio = paced["stunnerd"] / paced["coturn"]
    plain_ratio = paced["no-gso"] / paced["coturn"]
    print(f"RATIO paced cpu_per_packet stunnerd/coturn = {paced_ratio:.2f}")
    print(f"RATIO paced cpu_per_packet stunnerd(no GSO)/coturn = {plain_ratio:.2f}")
    ours_vs_upstream("paced", paced)
    print(
        f"Send/Data indications: uclient -s -m {SESSIONS} -c -z 0 -l 100 -n {INDICATION_MESSAGES}"
    )
    for name, r in indications.items():
        print_runs([r], name)
    ind_ratio = indications["stunnerd"].us_per_packet / indications["coturn"].us_per_packet
    print(f"RATIO indications cpu_per_packet stunnerd/coturn = {ind_ratio:.2f}")
    ours_vs_upstream("indications", {n: r.us_per_packet for n, r in indications.items()})
    print(
        f"allocations: uclient -m {ALLOC_SESSIONS} -c -n 1 (allocate, bind, 1 echo each); "
        "uclient paces its sessions, so allocations/s mostly measures uclient and the CPU "
        "per allocation is the figure to compare"
    )
    for name, (alloc_ms, rate_s) in alloc.items():
        print(f"{name:<9} {alloc_ms:6.2f} ms CPU/allocation  {rate_s:7.1f} allocations/s (wall)")
    cpu_ratio = alloc["stunnerd"][0] / alloc["coturn"][0]
    print(f"RATIO cpu_per_allocation stunnerd/coturn = {cpu_ratio:.2f}")
    print(
        f"RATIO allocations_per_s stunnerd/coturn = {alloc['stunnerd'][1] / alloc['coturn'][1]:.2f}"
    )
    for name, (alloc_ms, _rate) in alloc.items():
        if name.startswith("upstream"):
            print(
                f"RATIO cpu_per_allocation ours/upstream = {alloc['stunnerd'][0] / alloc_ms:.2f}  "
                f"(upstream: stunnerd v1.2.1 --udp-thread-num {name.removeprefix('upstream x')})"
            )


PART = os.environ.get("BENCH_TURN_PART", "all")
STORM_ALLOCATIONS = int(os.environ.get("BENCH_TURN_STORM_ALLOCATIONS", "2000"))
STORM_CLIENTS = int(os.environ.get("BENCH_TURN_STORM_CLIENTS", "50"))
STORM_TIMEOUT_S = float(os.environ.get("BENCH_TURN_STORM_TIMEOUT_S", "300"))
STORM_ENV = {"STUNNERD_CHALLENGE_RATE_PER_S": "0"}  # all clients are 127.0.0.1: no per-IP budget


NO_JOURNAL = "stunnerd -u 2, no journal"
"""Workers that journal no allocation to the supervisor (`STUNNERD_WORKER_JOURNAL=false`): a
crashed worker's allocations end with it, as all of upstream's do when its process dies."""


def storm_servers(
    turnserver: str, stunnerd: str, tmp: Path
) -> list[tuple[str, list[str], dict[str, str]]]:
    """(label, argv with {port} and {config}, extra env) of every server the storm races."""
    from bench import upstream_peer

    coturn = coturn_args(turnserver, 0, tmp, min_port=20000)
    coturn = [a.replace("--max-port=20999", "--max-port=60000") for a in coturn]
    coturn = [
        a if not a.startswith("--listening-port=") else "--listening-port={port}" for a in coturn
    ]
    ours = [stunnerd, "-c", "{config}", "--bind", "127.0.0.1", "--grace-period", "0"]
    servers = [
        ("stunnerd", ours, STORM_ENV),
        ("stunnerd -u 2", [*ours, "--udp-thread-num", "2"], STORM_ENV),
        (
            NO_JOURNAL,
            [*ours, "--udp-thread-num", "2"],
            {**STORM_ENV, "STUNNERD_WORKER_JOURNAL": "false"},
        ),
    ]
    binary, why = upstream_peer.upstream_stunnerd()
    if binary is None:
        print(f"storm: upstream stunnerd: {why}; raced without it")
    else:
        for threads in upstream_peer.thread_counts():
            servers.append(
                (
                    upstream_peer.label(threads),
                    upstream_peer.argv(binary, Path("{config}"), threads),
                    {},
                )
            )
    servers.append(("coturn", coturn, {}))
    return servers


def storm_one(argv: list[str], env: dict[str, str], tmp: Path, label: str) -> object:
    from bench import alloc_storm

    port = free_port()
    cfg = tmp / f"storm-{port}.json"
    cfg.write_text(json.dumps(stunnerd_config(port)))
    argv = [a.replace("{port}", str(port)).replace("{config}", str(cfg)) for a in argv]
    log = tmp / f"storm-{port}.log"
    with process(argv, log, env={**os.environ, **env}) as proc:
        wait_udp_listening(port, proc, log)
        time.sleep(0.5)  # workers finish starting
        before = cpu_seconds(proc.pid)
        latencies, failures, wall = alloc_storm.run_storm(
            port, STORM_ALLOCATIONS, STORM_CLIENTS, USER, PASSWORD, STORM_TIMEOUT_S
        )
        cpu = cpu_seconds(proc.pid) - before
    return alloc_storm.StormResult(
        label, STORM_ALLOCATIONS, len(latencies), wall, cpu, latencies, failures
    )


PROFILE_WRAPPER = """
import cProfile, signal, sys
out = sys.argv.pop(1)
prof = cProfile.Profile()
def start(*_):
    prof.enable()
def stop(*_):
    prof.disable()
    prof.dump_stats(out)
signal.signal(signal.SIGRTMIN + 1, start)
signal.signal(signal.SIGRTMIN + 2, stop)
sys.argv[0] = "stunnerd"
from stunnerd.__main__ import main
sys.exit(main())
"""


def storm_profile(stunnerd: str, tmp: Path) -> None:
    """Our one-process stunnerd under cProfile for the storm's window only: self time by bucket.

    The profiler is switched on and off by real-time signals (a wrapper around stunnerd's
    ``main``), so start-up is left out; uvloop's own C work (poll, recv, send, the socket calls it
    makes for endpoints) shows as the self time of the loop's ``run``."""
    from bench import alloc_storm

    port = free_port()
    cfg = tmp / "storm-profile.json"
    cfg.write_text(json.dumps(stunnerd_config(port)))
    out = tmp / "stunnerd.prof"
    python = str(Path(stunnerd).with_name("python"))
    argv = [python, "-c", PROFILE_WRAPPER, str(out), "-c", str(cfg), "--bind", "127.0.0.1"]
    log = tmp / "storm-profile.log"
    with process(argv, log, env={**os.environ, **STORM_ENV}) as proc:
        wait_udp_listening(port, proc, log, timeout_s=30.0)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGRTMIN + 1)
        time.sleep(0.2)
        latencies, _failures, _wall = alloc_storm.run_storm(
            port, STORM_ALLOCATIONS, STORM_CLIENTS, USER, PASSWORD, STORM_TIMEOUT_S
        )
        os.kill(proc.pid, signal.SIGRTMIN + 2)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # dump_stats finishes writing
    if not out.exists():
        print(f"storm profile: no profile written; log: {log.read_text()[-500:]}")
        return
    buckets, top, total = alloc_storm.profile_split(str(out))
    ok = max(1, len(latencies))
    print(
        f"storm profile (cProfile over the storm only, one process, {ok} allocations; "
        f"cProfile inflates Python calls): {total:.2f} s, {total * 1e6 / ok:.0f} µs/allocation"
    )
    for name, secs in sorted(buckets.items(), key=lambda kv: -kv[1]):
        share = 100 * secs / total if total else 0.0
        print(f"  {name:<26} {secs:6.2f} s {share:5.1f} %  {secs * 1e6 / ok:7.0f} µs/alloc")
    print("  functions with most self time:")
    for secs, where in top:
        print(f"    {secs:6.3f} s  {where.replace(str(Path(sys.prefix)), '<venv>')[-110:]}")


def storm_main(turnserver: str, stunnerd: str) -> None:
    from bench import alloc_storm

    room_for_fds(STORM_ALLOCATIONS)  # the storm holds every client socket to its end
    print(
        f"allocation storm: {STORM_ALLOCATIONS} allocations from {STORM_CLIENTS} clients "
        "(401 then authenticated Allocate, a fresh socket each, all held to the end), "
        "one server at a time"
    )
    results: dict[str, alloc_storm.StormResult] = {}
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp_name:
        tmp = Path(tmp_name)
        for label, argv, env in storm_servers(turnserver, stunnerd, tmp):
            result = storm_one(argv, env, tmp, label)
            assert isinstance(result, alloc_storm.StormResult)
            results[label] = result
        for line in alloc_storm.report_lines(results):
            print(line)
        for line in alloc_storm.ratio_lines(results, "stunnerd"):
            print(line)
        for line in alloc_storm.ratio_lines(results, "stunnerd -u 2"):
            print(line)
        for line in alloc_storm.ratio_lines(results, NO_JOURNAL):
            print(line)
        storm_profile(stunnerd, tmp)


def main() -> None:
    turnserver = shutil.which("turnserver") or "/usr/bin/turnserver"
    for tool in ("turnutils_uclient", "turnutils_peer"):
        if shutil.which(tool) is None:
            print(f"bench turn: {tool} (coturn) is not installed; skipped")
            return
    if not os.access(turnserver, os.X_OK):
        print("bench turn: turnserver (coturn) is not installed; skipped")
        return
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))
    if PART in ("all", "relay"):
        report(measure(turnserver, stunnerd))
    if PART in ("all", "storm"):
        storm_main(turnserver, stunnerd)


if __name__ == "__main__":
    main()
