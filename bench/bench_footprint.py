"""Idle footprint: stunnerd's resident memory at rest beside upstream's stunnerd and coturn, and
what stunnerd has imported by then.

Each server starts on 127.0.0.1 with one TURN/UDP listener and no allocation, is given
`IDLE_S` to settle, and its process tree is read from /proc: RSS (VmRSS) and PSS (smaps_rollup,
which shares the pages forked workers have in common fairly) per process. Ours runs as one
process and with `--udp-thread-num 2` (a supervisor and its workers), upstream's stunnerd with one
UDP thread and coturn with one relay thread, all in the same run.

A probe (a wrapper around stunnerd's `main` that dumps `sys.modules` on a real-time signal) lists
what an idle stunnerd has imported; each top-level package (and each subpackage of ours) is then
imported alone in a fresh interpreter and the RSS it adds over a bare interpreter is printed, the
largest first: an upper bound of what importing it lazily could save (packages share dependencies,
so the figures do not add up).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path

from bench.bench_turn import (
    coturn_args,
    free_port,
    process,
    stunnerd_config,
    tree_pids,
    wait_udp_listening,
)

IDLE_S = float(os.environ.get("BENCH_FOOTPRINT_IDLE_S", "3"))
TOP_MODULES = int(os.environ.get("BENCH_FOOTPRINT_TOP", "25"))

CDS_PEER = """
import asyncio, sys
from websockets.asyncio.server import serve

text = open(sys.argv[2]).read()

async def handler(ws):
    await ws.send(text)  # one v1 frame: the config; then nothing changes
    await ws.wait_closed()

async def main():
    async with serve(handler, "127.0.0.1", int(sys.argv[1])):
        await asyncio.Future()

asyncio.run(main())
"""
"""A CDS as a pod's stunnerd sees one while nothing changes: a WebSocket that sends the config
once (upstream's v1 frame)."""

PROBE = """
import json, signal, sys
out = sys.argv.pop(1)
def dump(*_):
    mods = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}
    with open(out, "w") as f:
        json.dump(mods, f)
signal.signal(signal.SIGRTMIN + 3, dump)
sys.argv[0] = "stunnerd"
from stunnerd.__main__ import main
sys.exit(main())
"""

OURS = ("stunnerd", "stunner_common")


def status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_memory(pid: int) -> list[tuple[int, int, int]]:
    """(pid, RSS KiB, PSS KiB) of each process of the tree."""
    return [(p, status_kib(p, "VmRSS"), pss_kib(p)) for p in tree_pids(pid)]


def group_modules(names: Iterable[str]) -> Counter[str]:
    """Module names grouped by top-level package, ours by their first subpackage."""
    groups: Counter[str] = Counter()
    for name in names:
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] in OURS and len(parts) > 1 else parts[0]
        groups[key] += 1
    return groups


def import_rss_kib(python: str, module: str) -> int:
    """The RSS a fresh interpreter has after importing ``module`` (0 when the import fails)."""
    code = (
        f"import importlib; importlib.import_module({module!r}); "
        "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])"
    )
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def idle_servers(stunnerd: str, tmp: Path) -> list[tuple[str, list[str]]]:
    from bench import upstream_peer

    servers = []
    ours = [stunnerd, "-c", "{config}", "--bind", "127.0.0.1"]
    servers.append(("stunnerd", ours))
    servers.append(("stunnerd -u 2", [*ours, "--udp-thread-num", "2"]))
    # As in a pod: following the CDS (websockets, the CDS client) instead of reading a file.
    cds = [stunnerd, "-w", "-c", "ws://127.0.0.1:{cds}", "--id", "bench/stunnerd"]
    servers.append(("stunnerd, CDS", [*cds, "--bind", "127.0.0.1"]))
    binary, why = upstream_peer.upstream_stunnerd()
    if binary is None:
        print(f"footprint: upstream stunnerd: {why}; measured without it")
    else:
        servers.append(("upstream x1", upstream_peer.argv(binary, Path("{config}"), 1)))
    turnserver = shutil.which("turnserver")
    if turnserver is None:
        print("footprint: coturn is not installed; measured without it")
    else:
        argv = coturn_args(turnserver, 0, tmp, min_port=30000)
        servers.append(
            ("coturn", ["--listening-port={port}" if a.startswith("--listening-port=") else a
                        for a in argv])
        )  # fmt: skip
    return servers


def measure_idle(stunnerd: str, tmp: Path) -> None:
    print(f"idle footprint after {IDLE_S:g} s, one TURN/UDP listener, no allocation (MiB)")
    print(f"{'server':<15} {'procs':>5} {'RSS':>7} {'PSS':>7}  per process RSS/PSS")
    rows: dict[str, dict[str, float]] = {}
    for label, template in idle_servers(stunnerd, tmp):
        port = free_port()
        cfg = tmp / f"idle-{port}.json"
        cfg.write_text(json.dumps(stunnerd_config(port)))
        argv = [a.replace("{port}", str(port)).replace("{config}", str(cfg)) for a in template]
        log = tmp / f"idle-{port}.log"
        with ExitStack() as stack:
            env = None
            if "{cds}" in " ".join(template):
                cds = free_port(socket.SOCK_STREAM)
                argv = [a.replace("{cds}", str(cds)) for a in argv]
                cds_peer = [sys.executable, "-c", CDS_PEER, str(cds), str(cfg)]
                stack.enter_context(process(cds_peer, tmp / f"cds-{cds}.log"))
                health = free_port(socket.SOCK_STREAM)
                env = {
                    **os.environ,
                    "STUNNERD_BOOTSTRAP_HEALTH_ENDPOINT": f"http://127.0.0.1:{health}",
                }
            proc = stack.enter_context(process(argv, log, env))
            wait_udp_listening(port, proc, log)
            time.sleep(IDLE_S)
            mem = tree_memory(proc.pid)
        rss = sum(m[1] for m in mem) / 1024
        pss = sum(m[2] for m in mem) / 1024
        rows[label] = {"rss": rss, "pss": pss}
        each = " ".join(f"{m[1] / 1024:.1f}/{m[2] / 1024:.1f}" for m in mem)
        print(f"{label:<15} {len(mem):>5} {rss:>7.1f} {pss:>7.1f}  {each}")
    # RSS is what a node's memory holds for the process; PSS divides shared pages (libpython,
    # libc, libcrypto) among the processes mapping them, so it moves with whatever else runs.
    for kind in ("rss", "pss"):
        for ours in ("stunnerd", "stunnerd -u 2", "stunnerd, CDS"):
            for peer in ("upstream x1", "coturn"):
                if ours in rows and peer in rows and rows[peer][kind] > 0:
                    print(
                        f"RATIO footprint idle_{kind} ours/{peer.split()[0]} = "
                        f"{rows[ours][kind] / rows[peer][kind]:.2f}  (ours: {ours}; peer: {peer})"
                    )


def measure_modules(stunnerd: str, tmp: Path) -> None:
    python = str(Path(stunnerd).with_name("python"))
    port = free_port()
    cfg = tmp / "probe.json"
    cfg.write_text(json.dumps(stunnerd_config(port)))
    out = tmp / "modules.json"
    log = tmp / "probe.log"
    argv = [python, "-c", PROBE, str(out), "-c", str(cfg), "--bind", "127.0.0.1"]
    with process(argv, log) as proc:
        wait_udp_listening(port, proc, log)
        time.sleep(IDLE_S)
        os.kill(proc.pid, signal.SIGRTMIN + 3)
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
    modules: dict[str, str | None] = json.loads(out.read_text())
    groups = group_modules(modules)
    stdlib = set(sys.stdlib_module_names)
    base = import_rss_kib(python, "sys")
    sizes = []
    for group, count in groups.items():
        if group.split(".")[0] in stdlib and count < 3:
            continue
        sizes.append((import_rss_kib(python, group) - base, group, count))
    sizes.sort(reverse=True)
    print(
        f"modules an idle stunnerd has imported: {len(modules)} in {len(groups)} groups; "
        f"a bare interpreter is {base / 1024:.1f} MiB. RSS each group adds imported alone "
        f"(MiB; overlapping, so not additive), the {TOP_MODULES} largest:"
    )
    for added, group, count in sizes[:TOP_MODULES]:
        where = "stdlib" if group.split(".")[0] in stdlib else ""
        print(f"  {added / 1024:6.1f}  {group:<34} {count:>4} modules  {where}")


def main() -> None:
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))
    with tempfile.TemporaryDirectory(prefix="bench-footprint-") as tmp_name, ExitStack():
        tmp = Path(tmp_name)
        measure_idle(stunnerd, tmp)
        measure_modules(stunnerd, tmp)


if __name__ == "__main__":
    main()
