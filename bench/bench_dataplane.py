"""The managed dataplane: relay throughput with 1 vs 2 workers, and config apply latency.

Throughput: one stunnerd with `--udp-thread-num 1`, then with `--udp-thread-num 2` (two worker
processes sharing the UDP port with SO_REUSEPORT). One generator process opens 16 allocations
(aioice, so the kernel spreads their 5-tuples over the workers), binds a channel each, then floods
raw ChannelData with sendmmsg; a peer process counts what arrives with recvmmsg (both batched
through ctypes, so that they cost a fraction of what the relay costs per packet). The figure is
relayed packets per second over a fixed window, reported as the ratio 2 workers / 1 worker.
Rounds alternate. The generator and the peer run on the same cores as the workers, so on a
2-core machine the workers never have two cores to themselves.

Media rate (`bench.media_rate`): 1000 allocations at 50 packets/s each, coturn against stunnerd
at 1, 2 and 4 workers, CPU per relayed packet.

Apply latency: in-process, a `LocalDataplane` receives a 100-listener config (every listener
bound), then a one-listener change to it, then the same config again; each is timed from the
config handed over to applied. The peer figure is a full rebuild of the same 100 listeners (close
everything, apply again), so the ratio shows what applying deltas saves.
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import ctypes.util
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_turn import (
    PASSWORD,
    REALM,
    USER,
    cpu_seconds,
    free_port,
    process,
    wait_udp_listening,
)

ALLOCATIONS = 16  # per generator
BATCH = 32  # datagrams per sendmmsg/recvmmsg call
MSG_WAITFORONE = 0x10000
GENERATORS = int(os.environ.get("BENCH_DATAPLANE_GENERATORS", "1"))
PAYLOAD = 100
WARMUP_S = 1.0
MEASURE_S = float(os.environ.get("BENCH_DATAPLANE_SECONDS", "4"))
ROUNDS = int(os.environ.get("BENCH_DATAPLANE_ROUNDS", "3"))
LISTENERS = 100
APPLY_ROUNDS = 5


def stunnerd_config(port: int) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {"name": "bench/dataplane", "loglevel": "all:WARN", "healthcheck_endpoint": ""},
        "auth": {"type": "static", "realm": REALM,
                 "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [{"name": "bench/udp", "protocol": "TURN-UDP", "address": "127.0.0.1",
                       "port": port, "routes": ["bench/loopback"]}],
        "clusters": [{"name": "bench/loopback", "type": "STATIC", "endpoints": ["127.0.0.0/8"]}],
    }  # fmt: skip


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_IoVec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint)]


def _mmsg_vector(buffers: list[Any], lengths: list[int]) -> Any:
    """An mmsghdr array, one single-iovec message per buffer (for sendmmsg/recvmmsg)."""
    iovs = (_IoVec * len(buffers))()
    msgs = (_MMsgHdr * len(buffers))()
    for i, (buf, length) in enumerate(zip(buffers, lengths, strict=True)):
        iovs[i].iov_base = ctypes.cast(buf, ctypes.c_void_p)
        iovs[i].iov_len = length
        msgs[i].msg_hdr.msg_iov = ctypes.pointer(iovs[i])
        msgs[i].msg_hdr.msg_iovlen = 1
    return msgs, iovs


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _sink(port_out: Any, counter: Any, stop: Any) -> None:
    """Count every datagram that reaches the peer: recvmmsg in batches, so the peer stays cheap
    next to the relay it measures."""
    libc = _libc()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)  # SO_RCVTIMEO: recvmmsg returns -1 now and then, to check `stop`
    port_out.send(sock.getsockname()[1])
    buffers = [ctypes.create_string_buffer(2048) for _ in range(BATCH)]
    msgs, _iovs = _mmsg_vector(buffers, [2048] * BATCH)
    n = 0
    fd = sock.fileno()
    while not stop.is_set():
        got = libc.recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, None)
        if got > 0:
            n += got
            counter.value = n


def _generator(server_port: int, sink_port: int, ready: Any, go: Any, stop: Any) -> None:
    """Open allocations with aioice, bind a channel each, then flood raw ChannelData."""

    async def setup() -> list[tuple[socket.socket, bytes]]:
        from aioice.turn import create_turn_endpoint

        flows = []
        for _ in range(ALLOCATIONS):
            transport, _ = await create_turn_endpoint(
                asyncio.DatagramProtocol,
                server_addr=("127.0.0.1", server_port),
                username=USER,
                password=PASSWORD,
            )
            inner = transport._TurnTransport__inner_protocol  # type: ignore[attr-defined]
            await inner.send_data(b"bind", ("127.0.0.1", sink_port))
            channel = inner.peer_to_channel[("127.0.0.1", sink_port)]
            raw = socket.socket(fileno=os.dup(inner.transport.get_extra_info("socket").fileno()))
            raw.setblocking(True)
            flows.append((raw, struct.pack("!HH", channel, PAYLOAD) + b"x" * PAYLOAD))
        return flows

    flows = asyncio.run(setup())
    libc = _libc()
    batches = []
    for raw, data in flows:
        buf = ctypes.create_string_buffer(data, len(data))
        msgs, iovs = _mmsg_vector([buf] * BATCH, [len(data)] * BATCH)
        batches.append((raw.fileno(), msgs, (buf, iovs, raw)))
    ready.set()
    go.wait()
    while not stop.is_set():
        for _ in range(50):
            for fd, msgs, _keep in batches:
                libc.sendmmsg(fd, msgs, BATCH, 0)


def relay_rate(workers: int, tmp: Path) -> tuple[float, float, float, float]:
    """Packets/s relayed client → peer, server µs CPU per packet, and the cores used by the
    server and by generator + peer, with `workers` workers."""
    ctx = mp.get_context("fork")
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))
    port = free_port()
    cfg = tmp / f"stunnerd-{workers}.json"
    cfg.write_text(json.dumps(stunnerd_config(port)))
    argv = [stunnerd, "-c", str(cfg), "--bind", "127.0.0.1", "--udp-thread-num", str(workers)]
    log = tmp / f"sd-{workers}.log"
    counter = ctx.Value("q", 0, lock=False)
    go, stop = ctx.Event(), ctx.Event()
    port_in, port_out = ctx.Pipe(duplex=False)
    sink = ctx.Process(target=_sink, args=(port_out, counter, stop), daemon=True)
    sink.start()
    sink_port = int(port_in.recv())
    readies = [ctx.Event() for _ in range(GENERATORS)]
    gens = [
        ctx.Process(target=_generator, args=(port, sink_port, r, go, stop), daemon=True)
        for r in readies
    ]
    try:
        with process(argv, log) as sd:
            wait_udp_listening(port, sd, log)
            for gen in gens:
                gen.start()
            if not all(r.wait(60) for r in readies):
                raise RuntimeError(f"generator did not set up: {log.read_text()[-2000:]}")
            go.set()
            time.sleep(WARMUP_S)
            load = [g.pid for g in gens if g.pid is not None] + [sink.pid or 0]
            c0, cpu0, t0 = counter.value, cpu_seconds(sd.pid), time.monotonic()
            load0 = sum(cpu_seconds(pid) for pid in load)
            time.sleep(MEASURE_S)
            c1, cpu1, t1 = counter.value, cpu_seconds(sd.pid), time.monotonic()
            load1 = sum(cpu_seconds(pid) for pid in load)
            stop.set()
    finally:
        stop.set()
        for p in (*gens, sink):
            p.join(10)
            if p.is_alive():
                p.kill()
    relayed = c1 - c0
    wall = t1 - t0
    return (
        relayed / wall,
        (cpu1 - cpu0) * 1e6 / max(1, relayed),
        (cpu1 - cpu0) / wall,
        (load1 - load0) / wall,
    )


def throughput() -> None:
    results: dict[int, list[tuple[float, float, float, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="bench-dataplane-") as tmp_name:
        for _ in range(ROUNDS):
            for workers in (1, 2):
                results[workers].append(relay_rate(workers, Path(tmp_name)))
    print(
        f"ChannelData flood, {ALLOCATIONS} allocations x {PAYLOAD} B from {GENERATORS} "
        f"generator(s) to a counting peer; {MEASURE_S:.0f} s windows, {ROUNDS} alternating rounds, "
        f"{os.cpu_count()} cores shared by generator, peer and workers"
    )
    print(
        f"{'workers':>7} {'pkts/s':>9} {'µs CPU/pkt':>11} {'server cores':>12} {'load cores':>10}"
    )
    for workers, series in results.items():
        for rate, us, server, load in series:
            print(f"{workers:>7} {rate:>9.0f} {us:>11.2f} {server:>12.2f} {load:>10.2f}")
    med = {w: statistics.median(r[0] for r in s) for w, s in results.items()}
    print(f"median relayed packets/s: 1 worker {med[1]:.0f}, 2 workers {med[2]:.0f}")
    print(f"RATIO throughput 2_workers/1_worker = {med[2] / med[1]:.2f}")


def distinct_udp_ports(count: int) -> list[int]:
    """`count` different free UDP ports (held open together while picking, so none repeats)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def hundred_listeners(ports: list[int], realm: str = REALM) -> Any:
    from stunner_common.config import parse_config

    return parse_config(
        {
            "version": "v1",
            "admin": {"name": "bench/apply", "healthcheck_endpoint": ""},
            "auth": {"type": "static", "realm": realm,
                     "credentials": {"username": USER, "password": PASSWORD}},
            "listeners": [
                {"name": f"l{i:03d}", "protocol": "TURN-UDP", "address": "127.0.0.1",
                 "port": port, "routes": ["c"]}
                for i, port in enumerate(ports)
            ],
            "clusters": [{"name": "c", "endpoints": ["127.0.0.0/8"]}],
        }
    )  # fmt: skip


async def apply_latency() -> None:
    from stunnerd.net.server import ServerOptions, TurnServer
    from stunnerd.workers.local import LocalDataplane

    ports = distinct_udp_ports(LISTENERS)
    full = hundred_listeners(ports)
    data = json.loads(full.canonical_json())
    data["listeners"][0]["routes"] = []
    from stunner_common.config import parse_config

    one_changed = parse_config(data)
    timings: dict[str, list[float]] = {"initial": [], "one-listener delta": [], "identical": []}
    rebuild: list[float] = []
    for _ in range(APPLY_ROUNDS):
        dp = LocalDataplane(TurnServer(ServerOptions(bind_host="127.0.0.1")))
        try:
            for label, config in (
                ("initial", full),
                ("one-listener delta", one_changed),
                ("identical", one_changed),
            ):
                started = time.perf_counter()
                outcome = await dp.apply(config)
                timings[label].append(time.perf_counter() - started)
                assert outcome.error is None, outcome.error
            started = time.perf_counter()
            await dp.server.close()
            fresh = LocalDataplane(dp.server)
            outcome = await fresh.apply(copy.copy(full))
            rebuild.append(time.perf_counter() - started)
            assert outcome.error is None, outcome.error
        finally:
            await dp.close()
    print(f"config apply latency, {LISTENERS} TURN-UDP listeners, median of {APPLY_ROUNDS}:")
    med = {label: statistics.median(v) * 1e3 for label, v in timings.items()}
    for label, ms in med.items():
        print(f"  {label:<20} {ms:8.2f} ms")
    full_ms = statistics.median(rebuild) * 1e3
    print(f"  {'full rebuild (peer)':<20} {full_ms:8.2f} ms")
    delta_ratio = med["one-listener delta"] / full_ms
    print(f"RATIO apply_latency one_listener_delta/full_rebuild = {delta_ratio:.3f}")


def main() -> None:
    throughput()
    from bench.media_rate import media

    media()
    asyncio.run(apply_latency())


if __name__ == "__main__":
    main()
