"""Media-rate relaying: many allocations at a voice call's packet rate, coturn against stunnerd.

At 50 packets per second per allocation nothing can be batched per socket: each relay socket
wakes its server for every datagram. This is where a relay spends most of its time in real
deployments, and where the per-datagram overhead of an interpreter shows most.

One generator process opens `MEDIA_ALLOCATIONS` allocations (Allocate with long-term credentials,
ChannelBind to the peer, each from its own client socket), then every 20 ms sends one 160-byte
ChannelData frame per allocation and drains what came back. The peer echoes every datagram
(recvmmsg/sendmmsg through ctypes, so that it stays cheap); both directions are relayed. The
figure is server CPU (utime+stime of the server's process tree from /proc) per relayed packet
over a fixed window, for coturn with `--relay-threads=N` and stunnerd with `--udp-thread-num N`,
N = 1, 2, 4, each on a fresh server. Loss is sent minus echoed-back, over the window plus a short
wait for stragglers. The generator and the peer share the machine's cores with the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import select
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_dataplane import _IoVec, _MMsgHdr
from bench.bench_turn import (
    PASSWORD,
    REALM,
    USER,
    cpu_seconds,
    free_port,
    process,
    stunnerd_config,
    wait_udp_listening,
)

MEDIA_ALLOCATIONS = int(os.environ.get("BENCH_MEDIA_ALLOCATIONS", "1000"))
MEDIA_PPS = 50
MEDIA_PAYLOAD = 160
MEDIA_WORKERS = tuple(int(n) for n in os.environ.get("BENCH_MEDIA_WORKERS", "1,2,4").split(","))
MEDIA_ROUNDS = int(os.environ.get("BENCH_MEDIA_ROUNDS", "1"))
WARMUP_S = 2.0
MEASURE_S = float(os.environ.get("BENCH_MEDIA_SECONDS", "6"))
STRAGGLERS_S = 0.5
SETUP_TIMEOUT_S = 120.0
START_TIMEOUT_S = 60.0  # a busy machine can take long to start N Python workers
REQUEST_TIMEOUT_S = 1.0
REQUEST_TRIES = 5
PEER_BATCH = 64
MSG_WAITFORONE = 0x10000
CHANNEL = 0x4000


# ---------------------------------------------------------------------------- STUN client


def _stun(method: int, attrs: dict[str, Any], key: bytes | None, nonce: bytes | None) -> bytes:
    from aioice import stun

    msg = stun.Message(message_method=stun.Method(method), message_class=stun.Class.REQUEST)
    for name, value in attrs.items():
        msg.attributes[name] = value
    if key is not None and nonce is not None:
        msg.attributes["USERNAME"] = USER
        msg.attributes["REALM"] = REALM
        msg.attributes["NONCE"] = nonce
        msg.add_message_integrity(key)
    msg.add_fingerprint()
    return bytes(msg)


def _transact(
    socks: list[socket.socket], requests: list[bytes], server: tuple[str, int]
) -> list[Any]:
    """Send one request per socket and collect each answer (retransmitting the silent ones)."""
    from aioice import stun

    answers: list[Any] = [None] * len(socks)
    by_fd = {s.fileno(): i for i, s in enumerate(socks)}
    poller = select.epoll()
    for s in socks:
        poller.register(s.fileno(), select.EPOLLIN)
    try:
        for _ in range(REQUEST_TRIES):
            waiting = [i for i, a in enumerate(answers) if a is None]
            if not waiting:
                break
            for i in waiting:
                socks[i].sendto(requests[i], server)
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            while any(answers[i] is None for i in waiting):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for fd, _ev in poller.poll(left):
                    i = by_fd[fd]
                    with contextlib.suppress(BlockingIOError):
                        data = socks[i].recv(4096)
                        if answers[i] is None and data[:1] in (b"\x01", b"\x00"):
                            answers[i] = stun.parse_message(data)
    finally:
        poller.close()
    if any(a is None for a in answers):
        raise RuntimeError("the server did not answer every request")
    return answers


def open_allocations(
    count: int, server: tuple[str, int], peer: tuple[str, int], local_ip: str = "127.0.0.1"
) -> list[Any]:
    """`count` client sockets bound to `local_ip`, each with an allocation and channel 0x4000 bound
    to `peer`."""
    from aioice import stun

    key = hashlib.md5(f"{USER}:{REALM}:{PASSWORD}".encode()).digest()
    socks: list[socket.socket] = []
    for start in range(0, count, 100):
        batch = []
        for _ in range(min(100, count - start)):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
            s.bind((local_ip, 0))
            s.setblocking(False)
            batch.append(s)
        alloc = {"LIFETIME": 600, "REQUESTED-TRANSPORT": 17 << 24}
        unauthenticated = _stun(stun.Method.ALLOCATE, alloc, None, None)
        first = _transact(batch, [unauthenticated] * len(batch), server)
        nonces = [a.attributes["NONCE"] for a in first]
        done = _transact(
            batch, [_stun(stun.Method.ALLOCATE, alloc, key, n) for n in nonces], server
        )
        for a in done:
            if a.message_class != stun.Class.RESPONSE:
                raise RuntimeError(f"Allocate failed: {a.attributes.get('ERROR-CODE')}")
        bind = {"CHANNEL-NUMBER": CHANNEL, "XOR-PEER-ADDRESS": peer}
        bound = _transact(
            batch, [_stun(stun.Method.CHANNEL_BIND, bind, key, n) for n in nonces], server
        )
        for a in bound:
            if a.message_class != stun.Class.RESPONSE:
                raise RuntimeError(f"ChannelBind failed: {a.attributes.get('ERROR-CODE')}")
        socks += batch
    return socks


def close_allocations(socks: list[socket.socket], server: tuple[str, int]) -> None:
    """Refresh with lifetime 0 on every socket (a fresh nonce first): the allocations end now
    instead of lingering until their lifetime runs out. Unanswered requests are let go."""
    from aioice import stun

    key = hashlib.md5(f"{USER}:{REALM}:{PASSWORD}".encode()).digest()
    for start in range(0, len(socks), 100):
        batch = socks[start : start + 100]
        with contextlib.suppress(RuntimeError, KeyError):
            first = _transact(
                batch, [_stun(stun.Method.REFRESH, {}, None, None)] * len(batch), server
            )
            nonces = [a.attributes["NONCE"] for a in first]
            end = {"LIFETIME": 0}
            _transact(batch, [_stun(stun.Method.REFRESH, end, key, n) for n in nonces], server)


# ---------------------------------------------------------------------------- processes


def _drain(sock: socket.socket, buf: bytearray) -> int:
    """Read what is queued on `sock`; how many datagrams that was."""
    n = 0
    try:
        while True:
            sock.recv_into(buf)
            n += 1
    except BlockingIOError:
        return n


def _generator(server_port: int, peer_port: int, conn: Any, counters: Any, stop: Any) -> None:
    """Open the allocations, report ready, then send at the media rate until `stop`."""
    try:
        socks = open_allocations(
            MEDIA_ALLOCATIONS, ("127.0.0.1", server_port), ("127.0.0.1", peer_port)
        )
    except Exception as exc:  # reported to the parent, which prints it
        conn.send(f"error: {exc!r}")
        return
    conn.send("ready")
    frame = struct.pack("!HH", CHANNEL, MEDIA_PAYLOAD) + b"m" * MEDIA_PAYLOAD
    server = ("127.0.0.1", server_port)
    interval = 1.0 / MEDIA_PPS
    sent = received = 0
    buf = bytearray(2048)
    next_tick = time.monotonic()
    while not stop.is_set():
        for s in socks:
            received += _drain(s, buf)
            try:
                s.sendto(frame, server)
                sent += 1
            except BlockingIOError:
                pass
        counters[0] = sent
        counters[1] = received
        next_tick += interval
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -1.0:
            next_tick = time.monotonic()  # far behind: do not burst to catch up
    deadline = time.monotonic() + STRAGGLERS_S
    while time.monotonic() < deadline:
        for s in socks:
            received += _drain(s, buf)
        time.sleep(0.02)
    counters[1] = received


def _echo_peer(conn: Any, counter: Any, stop: Any) -> None:
    """Echo every datagram to its sender, in batches of up to PEER_BATCH."""
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 * 1024 * 1024)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)  # recvmmsg returns now and then, to check `stop`
    conn.send(sock.getsockname()[1])
    bufs = [ctypes.create_string_buffer(2048) for _ in range(PEER_BATCH)]
    names = [ctypes.create_string_buffer(16) for _ in range(PEER_BATCH)]
    iovs = (_IoVec * PEER_BATCH)()
    msgs = (_MMsgHdr * PEER_BATCH)()
    for i in range(PEER_BATCH):
        iovs[i].iov_base = ctypes.cast(bufs[i], ctypes.c_void_p)
        msgs[i].msg_hdr.msg_iov = ctypes.pointer(iovs[i])
        msgs[i].msg_hdr.msg_iovlen = 1
        msgs[i].msg_hdr.msg_name = ctypes.cast(names[i], ctypes.c_void_p)
    fd = sock.fileno()
    n = 0
    while not stop.is_set():
        for i in range(PEER_BATCH):
            iovs[i].iov_len = 2048
            msgs[i].msg_hdr.msg_namelen = 16
        got = libc.recvmmsg(fd, msgs, PEER_BATCH, MSG_WAITFORONE, None)
        if got <= 0:
            continue
        for i in range(got):
            iovs[i].iov_len = msgs[i].msg_len
        libc.sendmmsg(fd, msgs, got, 0)
        n += got
        counter.value = n


@dataclass
class MediaRun:
    server: str
    workers: int
    forwarded: int
    sent: int
    lost: int
    wall_s: float
    cpu_s: float

    @property
    def us_per_packet(self) -> float:
        return self.cpu_s * 1e6 / max(1, self.forwarded)

    @property
    def pps(self) -> float:
        return self.forwarded / self.wall_s

    @property
    def loss_pct(self) -> float:
        return 100.0 * self.lost / max(1, self.sent)


def media_run(
    name: str,
    workers: int,
    argv: list[str],
    port: int,
    tmp: Path,
    env: dict[str, str] | None = None,
) -> MediaRun:
    ctx = mp.get_context("fork")
    stop_peer, stop_gen = ctx.Event(), ctx.Event()
    peer_in, peer_out = ctx.Pipe(duplex=False)
    peer_count = ctx.Value("q", 0, lock=False)
    peer = ctx.Process(target=_echo_peer, args=(peer_out, peer_count, stop_peer), daemon=True)
    peer.start()
    peer_port = int(peer_in.recv())
    gen_in, gen_out = ctx.Pipe(duplex=False)
    counters = ctx.Array("q", 2, lock=False)
    gen = ctx.Process(
        target=_generator, args=(port, peer_port, gen_out, counters, stop_gen), daemon=True
    )
    log = tmp / f"{name}-{workers}.log"
    try:
        with process(argv, log, env=env) as srv:
            wait_udp_listening(port, srv, log, START_TIMEOUT_S)
            gen.start()
            if not gen_in.poll(SETUP_TIMEOUT_S):
                raise RuntimeError(f"{name}: allocations not set up in time")
            state = gen_in.recv()
            if state != "ready":
                raise RuntimeError(f"{name} x{workers}: {state}; {log.read_text()[-1500:]}")
            time.sleep(WARMUP_S)
            s0, r0, p0 = counters[0], counters[1], peer_count.value
            cpu0, t0 = cpu_seconds(srv.pid), time.monotonic()
            time.sleep(MEASURE_S)
            s1, r1, p1 = counters[0], counters[1], peer_count.value
            cpu1, t1 = cpu_seconds(srv.pid), time.monotonic()
            stop_gen.set()
            gen.join(10)
            sent_total, received_total = counters[0], counters[1]
    finally:
        stop_gen.set()
        stop_peer.set()
        for p in (gen, peer):
            if p.pid is None:
                continue  # never started
            p.join(5)
            if p.is_alive():
                p.kill()
    # Forwarded in the window: client → peer (the peer's count) and peer → client (echoes).
    forwarded = (p1 - p0) + (r1 - r0)
    return MediaRun(
        name, workers, forwarded, s1 - s0, max(0, sent_total - received_total), t1 - t0, cpu1 - cpu0
    )


def coturn_argv(port: int, threads: int, tmp: Path) -> list[str]:
    turnserver = shutil.which("turnserver") or "/usr/sbin/turnserver"
    return [
        turnserver, "-n", "--no-cli", "--no-tls", "--no-dtls", "--log-file=stdout",
        "--simple-log", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
        f"--listening-port={port}", "--min-port=20000", "--max-port=59999",
        "--allow-loopback-peers", "--lt-cred-mech", f"--user={USER}:{PASSWORD}",
        f"--realm={REALM}", "--fingerprint", f"--relay-threads={threads}",
        f"--db={tmp / f'turndb-{threads}'}", f"--pidfile={tmp / f'turnserver-{threads}.pid'}",
    ]  # fmt: skip


def stunnerd_argv(port: int, workers: int, tmp: Path) -> list[str]:
    cfg = tmp / f"stunnerd-media-{workers}.json"
    cfg.write_text(json.dumps(stunnerd_config(port)))
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))
    return [stunnerd, "-c", str(cfg), "--bind", "127.0.0.1", "--udp-thread-num", str(workers)]


def media() -> None:
    if shutil.which("turnserver") is None and not os.access("/usr/sbin/turnserver", os.X_OK):
        print("media-rate scenario: turnserver (coturn) is not installed; skipped")
        return
    runs: dict[tuple[str, int], list[MediaRun]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-media-") as tmp_name:
        tmp = Path(tmp_name)
        python_path = {**os.environ, "STUNNERD_FASTPATH": "0"}
        for _ in range(MEDIA_ROUNDS):
            for workers in MEDIA_WORKERS:
                variants = ["coturn", "stunnerd"]
                if workers == MEDIA_WORKERS[0]:
                    variants.append("stunnerd-py")  # the C fast path off: what it saves
                for name in variants:
                    port = free_port()
                    make = coturn_argv if name == "coturn" else stunnerd_argv
                    env = python_path if name == "stunnerd-py" else None
                    run = media_run(name, workers, make(port, workers, tmp), port, tmp, env)
                    runs.setdefault((name, workers), []).append(run)
    print(
        f"media rate: {MEDIA_ALLOCATIONS} allocations x {MEDIA_PPS} pps x {MEDIA_PAYLOAD} B "
        f"ChannelData, echoed by the peer (both directions relayed); {MEASURE_S:.0f} s windows, "
        f"{MEDIA_ROUNDS} round(s); {os.cpu_count()} cores shared with generator and peer"
    )
    print("stunnerd-py: stunnerd with its C fast path off (STUNNERD_FASTPATH=0), the Python relay")
    print(
        f"{'server':<11} {'N':>2} {'relayed pkt/s':>13} {'loss %':>7} {'server cores':>12} "
        f"{'µs CPU/pkt':>10}"
    )
    for (name, workers), series in runs.items():
        for r in series:
            print(
                f"{name:<11} {workers:>2} {r.pps:>13.0f} {r.loss_pct:>7.3f} "
                f"{r.cpu_s / r.wall_s:>12.2f} {r.us_per_packet:>10.2f}"
            )
    med = {k: statistics.median(r.us_per_packet for r in s) for k, s in runs.items()}
    rate = {k: statistics.median(r.pps for r in s) for k, s in runs.items()}
    for workers in MEDIA_WORKERS:
        ratio = med[("stunnerd", workers)] / med[("coturn", workers)]
        print(f"RATIO cpu_per_packet_media stunnerd/coturn workers={workers} = {ratio:.2f}")
    first = MEDIA_WORKERS[0]
    if ("stunnerd-py", first) in med:
        ratio = med[("stunnerd-py", first)] / med[("coturn", first)]
        print(
            f"RATIO cpu_per_packet_media stunnerd(python path)/coturn workers={first} = {ratio:.2f}"
        )
    # The offered load is fixed, so more workers relay more only where fewer were saturated;
    # the CPU scaling says what a packet costs with N workers next to one.
    for workers in MEDIA_WORKERS[1:]:
        for name in ("coturn", "stunnerd"):
            scale = rate[(name, workers)] / rate[(name, first)]
            cost = med[(name, workers)] / med[(name, first)]
            print(f"RATIO media_pps_scaling {name} workers={workers}/workers={first} = {scale:.2f}")
            print(
                f"RATIO media_cpu_per_packet_scaling {name} workers={workers}/workers={first} "
                f"= {cost:.2f}"
            )


if __name__ == "__main__":
    media()
