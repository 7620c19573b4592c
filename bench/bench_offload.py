"""Kernel offload: CPU per relayed packet of stunnerd offloaded (TC), stunnerd in user space and
coturn (one relay thread, = stunnerd's one process), the same load, through network namespaces.

    client ns (load generator) ─veth─ server ns (the server) ─veth─ peer ns (echo peer)

The offloaded stunnerd has three namespaces of its own, with its own echo peer: its program runs
on every datagram of the interfaces it is attached to, and the other servers and the
IP-forwarding reference must not pay for its lookups.

The load is `udp_load` (bench/udp_load.c, compiled here with cc), so that the generator's and
the peer's own CPU stays small next to the relay's. The client side opens the allocations in
Python (bench/offload_load.py: Allocate, ChannelBind to the peer), then `udp_load gen` sends from
every allocation and times what the peer echoes back; Refresh 0 ends the allocations after each
run, so no run meets another's leftovers. Two loads per server:
- media: `BENCH_OFFLOAD_ALLOCATIONS` (default 1000) allocations x 50 packets/s x 160 B for
  `BENCH_OFFLOAD_MESSAGES` (default 500, 10 s) messages each;
- flood: 10 allocations, no pacing, `BENCH_OFFLOAD_FLOOD_MESSAGES` each.

CPU per relayed packet (2 per echoed message) is, as the issue defines it, the whole machine's
busy time from /proc/stat (user, nice, system, irq, softirq, steal) minus the generator's and
the peer's own process CPU, over the generator's window. On a shared machine, what other tenants'
user processes ran meanwhile is subtracted too (`others_cpu_s`); on a quiet one that is nothing.
The figure after it in the table is the server's own processes plus all irq/softirq time, for
reference. Both still carry other tenants' softirq and kernel threads: the load average is
printed; run it when the machine is quiet and repeat (`BENCH_OFFLOAD_ROUNDS`) for a range.
This kernel accounts softirq by ticks (no CONFIG_IRQ_TIME_ACCOUNTING, check yours): packet work
done in softirq on the way out of a process's send call is charged to that process, so part of
every server's relay work is subtracted with the generator's and the peer's CPU. The reference
row `ip forward` (no TURN, the server namespace routing the generator's datagrams to the peer)
shows what the same accounting charges for the cheapest in-kernel path there is.

Our stunnerd runs in three modes: "user space" (its C fast path relaying bound channels, the
default), "python" (STUNNERD_FASTPATH=0, every packet through the Python engine) and "offloaded"
(TC). Upstream STUNner's stunnerd (Go, v1.2.1, user space; bench/upstream_peer.py) races them
in the same run with `--udp-thread-num` 1 and one thread per core; each of our modes gets
`RATIO cpu_per_packet ours/upstream` against each.

Beside CPU time (bench/offload_probe.py): the offload program's own nanoseconds per relayed
packet from the kernel's BPF statistics, its size in instructions, `RATIO cpu_per_packet
offloaded/ipforward` (how far the kernel path is from the cheapest path there is), and per mode
the instructions the machine retired per relayed packet where it has hardware counters.
`BENCH_OFFLOAD_SERVERS` (names, comma-separated, e.g. "offloaded,ip forward") runs only those.

Where perf can sample (bench/cpu_profile.py; `BENCH_OFFLOAD_PROFILE=0` turns it off), each
server's processes are profiled over the window: their CPU per packet is split into the server's
own code and the kernel's work in its context (by system call: send, receive, poll), and
`RATIO own_code_per_packet userspace/coturn` compares the part a relay writes itself. The
`floor` line is user space's kernel part alone over coturn's whole process CPU: what the ratio
would be if our own code cost nothing, since every socket relay makes the same system calls for
the same packets.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import upstream_peer
from bench.bench_turn import PASSWORD, REALM, USER, cpu_seconds, tree_pids
from bench.cpu_profile import Profiler
from bench.offload_probe import BpfProbe, Instructions
from bench.offload_report import FORWARD, Run, report

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import netns  # noqa: E402
from support.netns import PEER_IP, SERVER_CLIENT_IP, SERVER_PEER_IP, Topology  # noqa: E402

ALLOCATIONS = int(os.environ.get("BENCH_OFFLOAD_ALLOCATIONS", "1000"))
MEDIA_MESSAGES = int(os.environ.get("BENCH_OFFLOAD_MESSAGES", "500"))  # per allocation, 10 s
MEDIA_PPS = 50
FLOOD_SESSIONS = 10
FLOOD_MESSAGES = int(os.environ.get("BENCH_OFFLOAD_FLOOD_MESSAGES", "20000"))
ROUNDS = int(os.environ.get("BENCH_OFFLOAD_ROUNDS", "1"))
PROFILE = os.environ.get("BENCH_OFFLOAD_PROFILE", "1") != "0"
ONLY = {n.strip() for n in os.environ.get("BENCH_OFFLOAD_SERVERS", "").split(",") if n.strip()}
PAYLOAD = 160
STUNNERD_PORT, COTURN_PORT, PEER_PORT = 3478, 3578, 50000
SETUP_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 300.0
PEER_MAX_S = 3600
SOURCE = Path(__file__).with_name("udp_load.c")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PF_KTHREAD = 0x00200000


def others_cpu_s() -> float:
    """utime+stime+cutime+cstime summed over the machine's user processes outside this bench's
    own tree: what other tenants ran. The difference of two samples also counts a process that
    came and went in between, through its parent's cutime/cstime (minus what it had already run
    at the first sample). Kernel threads (ksoftirqd, kworkers) are left in: some of their work is
    the relay's."""
    ours = set(tree_pids(os.getpid()))
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[6]) & PF_KTHREAD:
            continue
        total += sum(int(f) for f in fields[11:15])  # fields 14-17 of stat(5)
    return total / CLK_TCK


def stunnerd_config(engine: str, port: int, health_port: int) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {
            "name": "bench/offload",
            "loglevel": "all:WARN",
            "healthcheck_endpoint": f"http://0.0.0.0:{health_port}",
            "offload_engine": engine,
        },
        "auth": {"type": "static", "realm": REALM,
                 "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [{"name": "bench/udp", "protocol": "TURN-UDP", "address": SERVER_CLIENT_IP,
                       "port": port, "routes": ["bench/peers"]}],
        "clusters": [{"name": "bench/peers", "type": "STATIC", "endpoints": [f"{PEER_IP}/32"]}],
    }  # fmt: skip


def coturn_argv(tmp: Path) -> list[str]:
    return [
        shutil.which("turnserver") or "turnserver", "-n", "--no-cli", "--no-tls", "--no-dtls",
        "--log-file=stdout", "--simple-log", f"--listening-ip={SERVER_CLIENT_IP}",
        f"--relay-ip={SERVER_PEER_IP}", f"--listening-port={COTURN_PORT}",
        "--min-port=40000", "--max-port=48999", "--lt-cred-mech", f"--user={USER}:{PASSWORD}",
        f"--realm={REALM}", "--fingerprint", "--relay-threads=1", "--total-quota=0",
        "--user-quota=0", f"--db={tmp / 'turndb'}", f"--pidfile={tmp / 'turnserver.pid'}",
    ]  # fmt: skip


def wait_port(topo: Topology, port: int, timeout_s: float = 30.0) -> None:
    code = (
        "import os, socket, sys, time\n"
        "req = b'\\x00\\x01\\x00\\x00\\x21\\x12\\xa4\\x42' + os.urandom(12)\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.2)\n"
        f"end = time.monotonic() + {timeout_s}\n"
        "while time.monotonic() < end:\n"
        "    s.sendto(req, (sys.argv[1], int(sys.argv[2])))\n"
        "    try: s.recv(2048); sys.exit(0)\n"
        "    except OSError: pass\n"
        "sys.exit(1)\n"
    )
    done = topo.run(topo.client, sys.executable, "-c", code, SERVER_CLIENT_IP, str(port))
    if done.returncode != 0:
        raise RuntimeError(f"no TURN server answers on {SERVER_CLIENT_IP}:{port}")


def set_forwarding(topo: Topology, on: bool) -> None:
    topo.run(topo.server, "sysctl", "-qw", f"net.ipv4.ip_forward={int(on)}")


def measure(
    topo: Topology, udp_load: Path, server: str, pid: int | None, port: int, load: str,
    peer_pid: int, bpf: BpfProbe | None = None, profiler: Profiler | None = None,
) -> Run:  # fmt: skip
    count, pps, messages = (
        (ALLOCATIONS, MEDIA_PPS, MEDIA_MESSAGES)
        if load == "media"
        else (FLOOD_SESSIONS, 0, FLOOD_MESSAGES)
    )
    argv = [sys.executable, "-m", "bench.offload_load", str(udp_load), SERVER_CLIENT_IP, str(port)]
    argv += [PEER_IP, str(PEER_PORT), str(count), str(pps), str(messages)]
    if pid is None:
        argv.append("--direct")
    driver = subprocess.Popen(
        topo.argv(topo.client, *argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert driver.stdout is not None
    try:
        line = driver.stdout.readline().strip()  # "start", once every allocation is bound
        if line != "start":
            driver.kill()
            raise RuntimeError(f"{line} {driver.communicate(timeout=30)[1][-400:]}".strip())
        server0 = cpu_seconds(pid) if pid else 0.0
        peer0, others0 = cpu_seconds(peer_pid), others_cpu_s()
        bpf0, insns = bpf.sample() if bpf else (0, 0), Instructions()
        insns.start()
        if profiler is not None and pid:
            profiler.start(tree_pids(pid))
        result_line = driver.stdout.readline()
        server1 = cpu_seconds(pid) if pid else 0.0
        perf_s = profiler.cpu_s() if profiler is not None else 0.0
        peer1, others1 = cpu_seconds(peer_pid), others_cpu_s()
        bpf1, instructions = bpf.sample() if bpf else (0, 0), insns.stop()
        profile = profiler.stop() if profiler is not None else None
        rest, err = driver.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.communicate()
        raise RuntimeError("the load did not finish in time") from None
    try:
        out = json.loads(result_line)
    except ValueError:
        raise RuntimeError(f"no result from the load: {result_line}{rest}{err[-400:]}") from None
    return Run(
        server,
        load,
        out["sent"],
        out["received"],
        out["busy_s"] - out["gen_cpu_s"] - (peer1 - peer0) - (others1 - others0) - perf_s,
        server1 - server0 + out["softirq_s"],
        out["rtt_p50_ms"],
        out["rtt_p99_ms"],
        bpf1[1] - bpf0[1],
        bpf1[0] - bpf0[0],
        instructions,
        server1 - server0,
        profile,
    )


def irq_time_accounting() -> str:
    """Whether this kernel accounts softirq time apart from the interrupted process."""
    try:
        text = gzip.decompress(Path("/proc/config.gz").read_bytes()).decode()
    except OSError:
        try:
            text = Path(f"/boot/config-{os.uname().release}").read_text()
        except OSError:
            return "unknown (neither /proc/config.gz nor /boot/config-*)"
    if "CONFIG_IRQ_TIME_ACCOUNTING=y" in text:
        return "yes: softirq time is the machine's, never a process's"
    return "no: softirq run in a process's context is charged to that process"


def build_load(tmp: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = tmp / "udp_load"
    subprocess.run([cc, "-O2", "-o", str(out), str(SOURCE)], check=True)
    return out


@dataclass
class Server:
    """A server under test: its process (None: the IP-forwarding reference), its TURN port, and
    the namespaces and echo peer it runs with."""

    pid: int | None
    port: int
    topo: Topology
    peer_pid: int


def main() -> None:
    missing = [t for t in ("turnserver", "cc") if not shutil.which(t)]
    if missing:
        print(f"bench offload: {', '.join(missing)} not installed; skipped")
        return
    reason = netns.netns_unavailable()
    if reason:
        print(f"bench offload: {reason}; skipped")
        return
    # the offloaded stunnerd's own namespaces: see the module's docstring
    topo, offload_topo = netns.make_topology(), None
    procs: list[subprocess.Popen[bytes]] = []
    bpf = BpfProbe()
    profiler = Profiler() if PROFILE else None
    try:
        offload_topo = netns.make_topology()
        with tempfile.TemporaryDirectory(prefix="bench-offload-") as tmp_name:
            tmp = Path(tmp_name)
            udp_load = build_load(tmp)
            assert udp_load is not None
            servers = start_servers(tmp, udp_load, topo, offload_topo, procs)
            status = netns.http_get(
                offload_topo, offload_topo.server, "http://127.0.0.1:8087/status"
            )
            offload = json.loads(status).get("offload", {}) if status.strip() else {}
            print(f"offloaded stunnerd: offload {json.dumps(offload)}")
            print(f"kernel IRQ time accounting: {irq_time_accounting()}")
            print(f"loadavg before: {Path('/proc/loadavg').read_text().strip()}")
            bpf.enable()
            bpf.find(servers["offloaded"].pid or 0)
            runs = run_rounds(udp_load, servers, bpf, profiler)
            print(f"loadavg after: {Path('/proc/loadavg').read_text().strip()}")
            print(
                f"media: {ALLOCATIONS} allocations x {MEDIA_PPS} packets/s x {PAYLOAD} B, "
                f"{MEDIA_MESSAGES} messages each; flood: {FLOOD_SESSIONS} allocations, no "
                f"pacing, {FLOOD_MESSAGES} each; {os.cpu_count()} cores; every message echoed "
                "(2 relayed packets)"
            )
            report(runs, bpf.insns())
    finally:
        bpf.restore()
        if profiler is not None:
            profiler.close()
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for each in (topo, offload_topo):
            if each is not None:
                each.close()


def start_servers(
    tmp: Path, udp_load: Path, topo: Topology, offload_topo: Topology,
    procs: list[subprocess.Popen[bytes]],
) -> dict[str, Server]:  # fmt: skip
    """Every server, each with its echo peer, started and listening (their processes go into
    `procs`, for the caller to stop)."""
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))

    def start(ns: str, argv: list[str], log: str, at: Topology = topo) -> subprocess.Popen[bytes]:
        with open(tmp / log, "wb") as out:
            proc = subprocess.Popen(at.argv(ns, *argv), stdout=out, stderr=out)
        procs.append(proc)
        return proc

    peers = {}
    for name, each in (("peer", topo), ("offload-peer", offload_topo)):
        argv = [str(udp_load), "peer", PEER_IP, str(PEER_PORT), str(PEER_MAX_S)]
        peers[name] = start(each.peer, argv, f"{name}.log", each).pid
    servers: dict[str, Server] = {}
    coturn = start(topo.server, coturn_argv(tmp), "coturn.log")
    wait_port(topo, COTURN_PORT)
    servers["coturn"] = Server(coturn.pid, COTURN_PORT, topo, peers["peer"])
    for name, engine, port, health in (
        ("user space", "None", STUNNERD_PORT, 8086),
        ("offloaded", "TC", STUNNERD_PORT + 1, 8087),
        ("python", "None", STUNNERD_PORT + 2, 8088),
    ):
        path = tmp / f"stunnerd-{name.replace(' ', '-')}.json"
        path.write_text(json.dumps(stunnerd_config(engine, port, health)))
        argv = [stunnerd, "-c", str(path)]
        if name == "python":
            argv = ["env", "STUNNERD_FASTPATH=0", *argv]
        at, peer = (offload_topo, "offload-peer") if name == "offloaded" else (topo, "peer")
        proc = start(at.server, argv, f"{name.replace(' ', '-')}.log", at)
        wait_port(at, port)
        servers[name] = Server(proc.pid, port, at, peers[peer])
    upstream, why = upstream_peer.upstream_stunnerd()
    if upstream is None:
        print(f"upstream stunnerd: {why}; raced without it")
    for i, threads in enumerate(upstream_peer.thread_counts() if upstream else []):
        assert upstream is not None
        port, health = STUNNERD_PORT + 10 + i, 8090 + i
        path = tmp / f"upstream-{threads}.json"
        path.write_text(json.dumps(stunnerd_config("None", port, health)))
        name = upstream_peer.label(threads)
        proc = start(topo.server, upstream_peer.argv(upstream, path, threads), f"{name}.log")
        wait_port(topo, port)
        servers[name] = Server(proc.pid, port, topo, peers["peer"])
    servers[FORWARD] = Server(None, 0, topo, peers["peer"])
    return servers


def run_rounds(
    udp_load: Path, servers: dict[str, Server], bpf: BpfProbe, profiler: Profiler | None = None
) -> dict[tuple[str, str], list[Run]]:
    runs: dict[tuple[str, str], list[Run]] = {}
    chosen = {n: v for n, v in servers.items() if not ONLY or n in ONLY}
    for _ in range(ROUNDS):
        for load in ("media", "flood"):
            for name, server in chosen.items():
                set_forwarding(server.topo, server.pid is None)
                probe = bpf if name == "offloaded" else None
                try:
                    run = measure(
                        server.topo, udp_load, name, server.pid, server.port, load,
                        server.peer_pid, probe, profiler,
                    )  # fmt: skip
                except RuntimeError as exc:
                    print(f"{load} run against {name} failed: {str(exc)[-400:]}")
                    continue
                finally:
                    set_forwarding(server.topo, False)
                runs.setdefault((name, load), []).append(run)
    return runs


if __name__ == "__main__":
    main()
