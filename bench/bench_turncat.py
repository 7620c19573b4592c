"""turncat's relay throughput through coturn, against coturn's own client in the same run.

Three measurements on loopback, all through one coturn (one relay thread) to a UDP echo peer:

1. `turnutils_uclient` (coturn's C client): one session, channels, flood, 100-byte payloads;
   round trips per second over the wall time of the run. This is the anchor.
2. turncat in the middle: a closed-loop UDP client (uvloop, 32 datagrams in flight) sends to
   turncat, which relays through coturn to the echo peer; round trips per second, and turncat's
   CPU time per relayed datagram. Reported as a ratio to (1).
3. iperf2 through turncat (upstream STUNner's benchmark kit,
   https://github.com/l7mp/stunner/blob/main/docs/BENCHMARK.md): iperf -c
   → turncat → coturn → iperf -s -u -e as the peer, at a few offered rates, 100-byte datagrams;
   the received rate and loss. Skipped when iperf is not installed.

Every run is bounded in count and time; nothing is asserted, the report is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

from stunner_common.runtime import run as run_loop

HOST = "127.0.0.1"
USER, PASSWORD, REALM = "user1", "passwd1", "stunner.l7mp.io"
PAYLOAD_BYTES = 100
SESSIONS = 10
UCLIENT_MSGS_PER_SESSION = 20_000
MSGS_PER_SESSION = 5_000
WINDOW_PER_SESSION = 8
RUN_LIMIT_S = 30.0
IPERF_SECONDS = 4
IPERF_RATES_PPS = (10_000, 30_000)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        other = socket.SOCK_STREAM if kind == socket.SOCK_DGRAM else socket.SOCK_DGRAM
        with socket.socket(socket.AF_INET, other) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


@contextlib.contextmanager
def process(argv: list[str], log: Path, **kw: object) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kw,  # type: ignore[call-overload]
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)


def wait_tcp(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


def wait_log(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited: {log.read_text(errors='replace')[-1000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"{text!r} never appeared in {log}")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def run_uclient(turn_port: int, peer_port: int, tmp: Path) -> float:
    """coturn's client floods; its once-a-second progress lines give the peak round-trip rate."""
    argv = [
        "turnutils_uclient", "-p", str(turn_port), "-u", USER, "-w", PASSWORD,
        "-e", HOST, "-r", str(peer_port), "-m", str(SESSIONS), "-c", "-z", "0",
        "-n", str(UCLIENT_MSGS_PER_SESSION), "-l", str(PAYLOAD_BYTES), HOST,
    ]  # fmt: skip
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=RUN_LIMIT_S + 30, check=False
    )
    text = out.stdout + out.stderr
    (tmp / "uclient.log").write_text(text)
    progress = [
        (int(t), int(recv))
        for t, recv in re.findall(
            r"^(\d+): : start_mclient: msz=\d+, .*?tot_recv_msgs=(\d+)", text, re.M
        )
    ]
    peak = max(
        ((r1 - r0) / (t1 - t0) for (t0, r0), (t1, r1) in itertools.pairwise(progress) if t1 > t0),
        default=0.0,
    )
    lost = re.search(r"Total lost packets (\d+) \(([\d.]+)%\)", text)
    total = progress[-1][1] if progress else 0
    loss = f"{lost.group(1)} ({float(lost.group(2)):.1f}%)" if lost else "?"
    print(
        f"  turnutils_uclient ({SESSIONS} sessions, open-loop flood): {total} round trips,"
        f" peak {peak:,.0f} rt/s over 1 s, lost {loss}"
    )
    return peak


class ClosedLoop(asyncio.DatagramProtocol):
    """One local client of turncat: keeps a window of datagrams in flight, each reply sends the
    next one."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0
        self.received = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.payload = b"x" * PAYLOAD_BYTES
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def kick(self, n: int) -> None:
        assert self.transport is not None
        for _ in range(n):
            if self.sent < self.total:
                self.transport.sendto(self.payload)
                self.sent += 1

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received += 1
        if self.received >= self.total:
            if not self.done.done():
                self.done.set_result(None)
            return
        self.kick(1)


async def closed_loop(local_port: int) -> tuple[int, float]:
    """SESSIONS local clients (so SESSIONS allocations) in closed loop; (round trips, wall s)."""
    loop = asyncio.get_running_loop()
    clients = [
        await loop.create_datagram_endpoint(
            lambda: ClosedLoop(MSGS_PER_SESSION), remote_addr=(HOST, local_port)
        )
        for _ in range(SESSIONS)
    ]
    protos = [p for _, p in clients]
    try:
        started = time.monotonic()
        for p in protos:
            p.kick(WINDOW_PER_SESSION)
        last = [-1] * SESSIONS
        while time.monotonic() - started < RUN_LIMIT_S:
            pending = [asyncio.shield(p.done) for p in protos if not p.done.done()]
            if not pending:
                break
            await asyncio.wait(pending, timeout=0.5)
            for i, p in enumerate(protos):
                if not p.done.done() and p.received == last[i]:
                    p.kick(WINDOW_PER_SESSION)  # the window was lost to drops: refill it
                last[i] = p.received
        return sum(p.received for p in protos), time.monotonic() - started
    finally:
        for t, _ in clients:
            t.close()


def run_turncat_loop(turn_port: int, peer_port: int, tmp: Path) -> float:
    local_port = free_port()
    log = tmp / "turncat.log"
    argv = [
        sys.executable, "-m", "turncat", "-l", "all:INFO", f"udp://{HOST}:{local_port}",
        f"turn://{USER}:{PASSWORD}@{HOST}:{turn_port}?transport=udp", f"udp://{HOST}:{peer_port}",
    ]  # fmt: skip
    with process(argv, log) as proc:
        wait_log(log, "listening on", proc)
        cpu0 = cpu_s(proc.pid)
        got, wall = run_async(closed_loop(local_port))
        cpu = cpu_s(proc.pid) - cpu0
    rate = got / wall
    relayed = 2 * got
    print(
        f"  turncat ({SESSIONS} local clients, closed loop, window {WINDOW_PER_SESSION} each):"
        f" {got} round trips in {wall:.2f} s = {rate:,.0f} rt/s;"
        f" turncat CPU {cpu:.2f} s = {1e6 * cpu / max(relayed, 1):.1f} µs per relayed datagram"
    )
    return rate


def run_async(coro: Coroutine[Any, Any, tuple[int, float]]) -> tuple[int, float]:
    return run_loop(coro)


def run_iperf(turn_port: int, tmp: Path) -> None:
    if shutil.which("iperf") is None:
        print("  iperf2: not installed, skipped")
        return
    for pps in IPERF_RATES_PPS:
        peer_port, local_port = free_port(), free_port()
        server_log, tc_log = tmp / f"iperf-s-{pps}.log", tmp / f"turncat-iperf-{pps}.log"
        with (
            process(["iperf", "-s", "-u", "-e", "-p", str(peer_port), "-B", HOST], server_log),
            process(
                [
                    sys.executable,
                    "-m",
                    "turncat",
                    "-l",
                    "all:INFO",
                    f"udp://{HOST}:{local_port}",
                    f"turn://{USER}:{PASSWORD}@{HOST}:{turn_port}?transport=udp",
                    f"udp://{HOST}:{peer_port}",
                ],
                tc_log,
            ) as tc,
        ):
            wait_log(tc_log, "listening on", tc)
            bits = pps * PAYLOAD_BYTES * 8
            subprocess.run(
                [
                    "iperf",
                    "-c",
                    HOST,
                    "-u",
                    "-p",
                    str(local_port),
                    "-l",
                    str(PAYLOAD_BYTES),
                    "-b",
                    str(bits),
                    "-t",
                    str(IPERF_SECONDS),
                ],
                capture_output=True,
                timeout=IPERF_SECONDS + 20,
                check=False,
            )
            time.sleep(1.0)  # let the server print its report
        text = server_log.read_text(errors="replace")
        report = re.findall(r"(\d+)/(\d+)\s+\(([\d.]+)%\).*?(\d+) pps", text)
        if report:
            lost, total, pct, got_pps = report[-1]
            print(
                f"  iperf2 via turncat, offered {pps:,} pps x {PAYLOAD_BYTES} B:"
                f" received {got_pps} pps, loss {lost}/{total} ({pct}%)"
            )
        else:
            print(f"  iperf2 via turncat, offered {pps:,} pps: no server report:\n{text[-500:]}")


def main() -> None:
    for tool in ("turnserver", "turnutils_uclient", "turnutils_peer"):
        if shutil.which(tool) is None:
            print(f"bench turncat: {tool} not installed, skipped")
            return
    with tempfile.TemporaryDirectory(prefix="bench-turncat-") as d:
        tmp = Path(d)
        turn_port, peer_port = free_port(), free_port()
        coturn = [
            "turnserver", "-n", "--no-cli", "--no-tls", "--no-dtls", "--log-file=stdout",
            "--simple-log", f"--listening-ip={HOST}", f"--relay-ip={HOST}",
            f"--listening-port={turn_port}", "--allow-loopback-peers", "--lt-cred-mech",
            f"--user={USER}:{PASSWORD}", f"--realm={REALM}", "--fingerprint",
            "--relay-threads=1", f"--db={tmp / 'turndb'}", f"--pidfile={tmp / 'pid'}",
        ]  # fmt: skip
        with (
            process(coturn, tmp / "coturn.log"),
            process(["turnutils_peer", "-L", HOST, "-p", str(peer_port)], tmp / "peer.log"),
        ):
            wait_tcp(turn_port)
            print(f"coturn on {HOST}:{turn_port}, echo peer on {peer_port}, {PAYLOAD_BYTES} B")
            anchor = run_uclient(turn_port, peer_port, tmp)
            ours = run_turncat_loop(turn_port, peer_port, tmp)
            ratio = ours / anchor if anchor else float("nan")
            print(f"  ratio turncat rt/s / turnutils_uclient peak rt/s: {ratio:.2f}")
            run_iperf(turn_port, tmp)


if __name__ == "__main__":
    main()
