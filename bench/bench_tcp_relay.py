"""TCP relay (RFC 6062) cost: stunnerd (one process) against coturn 4.6 (one relay thread).

Both servers face the same generator, coturn's `turnutils_uclient -T`: pairs of clients, each
with a TCP allocation on a TURN-TCP listener, Connect to each other's relayed address (so the
server both connects out and accepts, then splices the data connections) and exchange 100-B
messages as fast as they can (`-z 0`). The figure of merit is server CPU per relayed message
(utime+stime of the server's process tree, divided by the messages received, each of which the
server read from one TCP connection and wrote to another). Runs alternate coturn / stunnerd.
Everything binds 127.0.0.1; every run is bounded in messages and in time.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_turn import (
    Run,
    coturn_args,
    cpu_seconds,
    free_port,
    parse_uclient,
    process,
    stunnerd_config,
    uclient,
)

PAIRS = 5  # -m: client pairs
MESSAGES = int(os.environ.get("BENCH_TCP_RELAY_MESSAGES", "10000"))  # -n, per client
ROUNDS = int(os.environ.get("BENCH_TCP_RELAY_ROUNDS", "3"))


def wait_tcp_listening(port: int, log: Path, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"server on {port} did not accept: {log.read_text()[-2000:]}")


def run(name: str, pid: int, port: int, args: list[str]) -> Run:
    before = cpu_seconds(pid)
    output, wall = uclient(port, 0, args)
    cpu = cpu_seconds(pid) - before
    sent, received, lost = parse_uclient(output)
    return Run(name, received, sent, lost, wall, cpu)


def main() -> None:
    turnserver = shutil.which("turnserver") or "/usr/bin/turnserver"
    if shutil.which("turnutils_uclient") is None or not os.access(turnserver, os.X_OK):
        print("bench tcp_relay: coturn (turnserver, turnutils_uclient) is not installed; skipped")
        return
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))
    args = ["-T", "-m", str(PAIRS), "-z", "0", "-n", str(MESSAGES), "-l", "100"]
    with tempfile.TemporaryDirectory(prefix="bench-tcp-relay-") as tmp_name:
        tmp = Path(tmp_name)
        coturn_port, stunnerd_port = free_port(), free_port()
        cfg = tmp / "stunnerd.json"
        cfg.write_text(json.dumps(stunnerd_config(stunnerd_port, "TURN-TCP")))
        coturn_argv = coturn_args(turnserver, coturn_port, tmp, min_port=51000)
        with (
            process(coturn_argv, tmp / "coturn.log") as coturn,
            process([stunnerd, "-c", str(cfg), "--bind", "127.0.0.1"], tmp / "sd.log") as sd,
        ):
            wait_tcp_listening(coturn_port, tmp / "coturn.log")
            wait_tcp_listening(stunnerd_port, tmp / "sd.log")
            servers = {"coturn": (coturn.pid, coturn_port), "stunnerd": (sd.pid, stunnerd_port)}
            for _pid, port in servers.values():  # warm-up, discarded
                uclient(port, 0, ["-T", "-m", "1", "-z", "0", "-n", "200", "-l", "100"])
            runs: dict[str, list[Run]] = {name: [] for name in servers}
            for _ in range(ROUNDS):
                for name, (pid, port) in servers.items():
                    runs[name].append(run(name, pid, port, args))
    print(f"TCP relays: uclient {' '.join(args)}, {ROUNDS} alternating rounds")
    print(f"{'server':<9} {'received':>9} {'loss %':>7} {'msgs/s':>9} {'CPU s':>7} {'µs/msg':>7}")
    for name, series in runs.items():
        for r in series:
            per_msg = r.cpu_s * 1e6 / max(1, r.round_trips)
            print(
                f"{name:<9} {r.round_trips:>9} {r.lost_pct:>7.3f} {r.rt_per_s:>9.0f} "
                f"{r.cpu_s:>7.2f} {per_msg:>7.2f}"
            )
    med = {
        name: statistics.median(r.cpu_s * 1e6 / max(1, r.round_trips) for r in series)
        for name, series in runs.items()
    }
    print(
        f"median µs CPU per relayed message: coturn {med['coturn']:.2f}, "
        f"stunnerd {med['stunnerd']:.2f}"
    )
    print(
        f"RATIO tcp_relay cpu_per_message stunnerd/coturn = {med['stunnerd'] / med['coturn']:.2f}"
    )


if __name__ == "__main__":
    main()
