"""What an attacker without credentials costs: stunnerd against coturn, the same bytes at both.

Each scenario is one kind of datagram a client without credentials can send: a bare Allocate
(answered 401), a Binding request (answered by design), an Allocate carrying bogus credentials,
an MTU-sized Allocate stuffed with XOR-PEER-ADDRESS attributes, a 2 KB and a 60 KB one, and
random bytes. Every datagram is sent to both servers in alternating rounds, in paced bursts from
one source, and the report gives, per scenario:
  - server CPU per datagram (on-CPU time of every thread of the server's process tree, from
    /proc/*/task/*/schedstat, before and after), as `RATIO cpu_per_hostile[...]
    stunnerd/coturn` (the goal is at most 2);
  - bytes answered per byte received (the amplification factor) for each server, and
    `RATIO amplification[...] stunnerd/coturn` where coturn answers at all (the goal is at most 1).
The servers are set up as in `bench_turn` (coturn 4.6 with long-term credentials and one relay
thread, stunnerd with one static user). Everything binds 127.0.0.1; every loop is bounded.
`BENCH_HOSTILE_CHALLENGE_RATE_PER_S=0` runs stunnerd with its per-source 401 budget off (coturn
has none), so every challenge is answered; the load average is printed before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.bench_turn import (
    REALM,
    USER,
    coturn_args,
    free_port,
    process,
    stunnerd_config,
    tree_pids,
    wait_udp_listening,
)

MAGIC = 0x2112A442
ALLOCATE, BINDING = 0x0003, 0x0001
ROUNDS = int(os.environ.get("BENCH_HOSTILE_ROUNDS", "3"))
CHALLENGE_RATE = os.environ.get("BENCH_HOSTILE_CHALLENGE_RATE_PER_S")
BYTES_PER_RUN = int(os.environ.get("BENCH_HOSTILE_BYTES", str(6_000_000)))
MAX_DATAGRAMS = 20_000
BURST = 32
BURST_GAP_S = 0.002
RUN_TIMEOUT_S = 60.0
SETTLE_S = 0.3


def cpu_seconds(pid: int) -> float:
    """On-CPU time of every thread of pid and its descendants, from schedstat (ns resolution).

    /proc/PID/stat counts in clock ticks (10 ms), too coarse for a few microseconds a datagram.
    """
    total = 0
    for p in tree_pids(pid):
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def attribute(kind: int, value: bytes) -> bytes:
    padding = b"\x00" * (-len(value) % 4)
    return struct.pack("!HH", kind, len(value)) + value + padding


def stun(method: int, attributes: bytes = b"") -> bytes:
    return struct.pack("!HHI", method, len(attributes), MAGIC) + os.urandom(12) + attributes


def xor_peer_address(index: int) -> bytes:
    port = (40000 + index) ^ (MAGIC >> 16)
    address = (0x7F000001 + index) ^ MAGIC
    return attribute(0x0012, struct.pack("!BBHI", 0, 1, port, address))


def stuffed(size: int) -> Callable[[], bytes]:
    count = (size - 20) // 12

    def build() -> bytes:
        return stun(ALLOCATE, b"".join(xor_peer_address(i) for i in range(count)))

    return build


def bogus_credentials() -> bytes:
    attrs = (
        attribute(0x0019, b"\x11\x00\x00\x00")  # REQUESTED-TRANSPORT: UDP
        + attribute(0x0006, USER.encode())
        + attribute(0x0014, REALM.encode())
        + attribute(0x0015, b"x" * 32)  # a NONCE neither server issued
    )
    header_length = len(attrs) + 24
    body = struct.pack("!HHI", ALLOCATE, header_length, MAGIC) + os.urandom(12) + attrs
    return body + attribute(0x0008, os.urandom(20))


def random_bytes() -> bytes:
    return os.urandom(1400)


SCENARIOS: dict[str, Callable[[], bytes]] = {
    "allocate-20B": lambda: stun(ALLOCATE),
    "binding-20B": lambda: stun(BINDING),
    "bad-credentials": bogus_credentials,
    "attrs-1480B": stuffed(1480),
    "attrs-2KB": stuffed(2084),
    "attrs-60KB": stuffed(60_000),
    "random-1400B": random_bytes,
}


@dataclass
class Tally:
    sent: int = 0
    sent_bytes: int = 0
    answers: int = 0
    answer_bytes: int = 0
    largest_answer: int = 0
    cpu_s: list[float] = field(default_factory=list)
    per_datagram_us: list[float] = field(default_factory=list)

    @property
    def amplification(self) -> float:
        return self.answer_bytes / self.sent_bytes if self.sent_bytes else 0.0


def blast(pid: int, port: int, build: Callable[[], bytes], tally: Tally) -> None:
    """Send one run of a scenario in paced bursts and collect every answer."""
    sample = build()
    count = max(50, min(MAX_DATAGRAMS, BYTES_PER_RUN // len(sample)))
    datagrams = [build() for _ in range(count)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        target = ("127.0.0.1", port)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        before = cpu_seconds(pid)
        for start in range(0, count, BURST):
            for datagram in datagrams[start : start + BURST]:
                s.sendto(datagram, target)
                tally.sent += 1
                tally.sent_bytes += len(datagram)
            _collect(s, tally, BURST_GAP_S)
            if time.monotonic() > deadline:
                break
        _collect(s, tally, SETTLE_S)
        cpu = cpu_seconds(pid) - before
    tally.cpu_s.append(cpu)
    tally.per_datagram_us.append(cpu * 1e6 / count)


def _collect(s: socket.socket, tally: Tally, wait_s: float) -> None:
    end = time.monotonic() + wait_s
    while True:
        try:
            data = s.recv(65536)
        except BlockingIOError:
            if time.monotonic() >= end:
                return
            time.sleep(0.0005)
            continue
        tally.answers += 1
        tally.answer_bytes += len(data)
        tally.largest_answer = max(tally.largest_answer, len(data))


def main() -> None:
    turnserver = shutil.which("turnserver") or "/usr/bin/turnserver"
    if not os.access(turnserver, os.X_OK):
        print("bench hostile: turnserver (coturn) is not installed; skipped")
        return
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp_name:
        tmp = Path(tmp_name)
        coturn_port, stunnerd_port = free_port(), free_port()
        cfg = tmp / "stunnerd.json"
        cfg.write_text(json.dumps(stunnerd_config(stunnerd_port)))
        coturn_argv = coturn_args(turnserver, coturn_port, tmp, min_port=51000)
        results: dict[str, dict[str, Tally]] = {
            name: {"coturn": Tally(), "stunnerd": Tally()} for name in SCENARIOS
        }
        sd_env = dict(os.environ)
        if CHALLENGE_RATE is not None:
            sd_env["STUNNERD_CHALLENGE_RATE_PER_S"] = CHALLENGE_RATE
        load_before = os.getloadavg()
        with (
            process(coturn_argv, tmp / "coturn.log") as coturn,
            process(
                [stunnerd, "-c", str(cfg), "--bind", "127.0.0.1"], tmp / "sd.log", env=sd_env
            ) as sd,
        ):
            wait_udp_listening(coturn_port, coturn, tmp / "coturn.log")
            wait_udp_listening(stunnerd_port, sd, tmp / "sd.log")
            servers = {"coturn": (coturn.pid, coturn_port), "stunnerd": (sd.pid, stunnerd_port)}
            for _ in range(ROUNDS):
                for name, build in SCENARIOS.items():
                    for server, (pid, port) in servers.items():
                        blast(pid, port, build, results[name][server])
            for server, proc in (("coturn", coturn), ("stunnerd", sd)):
                if proc.poll() is not None:
                    raise RuntimeError(f"{server} died under hostile input")
    report(results, load_before, os.getloadavg())


def report(
    results: dict[str, dict[str, Tally]],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> None:
    budget = "off" if CHALLENGE_RATE in ("0", "0.0") else "on"
    print(
        f"{ROUNDS} alternating rounds; per run about {BYTES_PER_RUN // 1_000_000} MB "
        f"(at most {MAX_DATAGRAMS} datagrams) in bursts of {BURST}, one source; "
        f"stunnerd's 401 budget {budget}"
    )
    print(
        "load average (1/5/15 min) before "
        + "/".join(f"{x:.1f}" for x in load_before)
        + ", after "
        + "/".join(f"{x:.1f}" for x in load_after)
    )
    print(
        f"{'scenario':<16} {'server':<9} {'datagrams':>9} {'answers':>8} {'largest':>7} "
        f"{'ampl.':>6} {'µs CPU/datagram (runs)':>28}"
    )
    for name, by_server in results.items():
        for server, t in by_server.items():
            runs = " ".join(f"{us:.1f}" for us in t.per_datagram_us)
            print(
                f"{name:<16} {server:<9} {t.sent:>9} {t.answers:>8} {t.largest_answer:>7} "
                f"{t.amplification:>6.2f} {runs:>28}"
            )
    for name, by_server in results.items():
        coturn, sd = by_server["coturn"], by_server["stunnerd"]
        c_us = statistics.median(coturn.per_datagram_us)
        s_us = statistics.median(sd.per_datagram_us)
        ratios = [
            s / c for s, c in zip(sd.per_datagram_us, coturn.per_datagram_us, strict=True) if c > 0
        ]
        spread = f" (runs {min(ratios):.2f}-{max(ratios):.2f})" if ratios else ""
        if c_us > 0:
            print(f"RATIO cpu_per_hostile[{name}] stunnerd/coturn = {s_us / c_us:.2f}{spread}")
        else:
            print(f"cpu_per_hostile[{name}]: coturn used no measurable CPU; stunnerd {s_us:.1f} µs")
    for name, by_server in results.items():
        coturn, sd = by_server["coturn"], by_server["stunnerd"]
        if coturn.amplification > 0:
            ratio = sd.amplification / coturn.amplification
            print(
                f"RATIO amplification[{name}] stunnerd/coturn = {ratio:.2f} "
                f"(stunnerd {sd.amplification:.2f}, coturn {coturn.amplification:.2f} bytes/byte)"
            )
        else:
            print(
                f"amplification[{name}]: coturn silent; stunnerd {sd.amplification:.2f} "
                f"bytes/byte ({sd.answers} answers)"
            )


if __name__ == "__main__":
    main()
