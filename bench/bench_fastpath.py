"""The C fast path's instructions per relayed packet, counted by callgrind on a fixed input.

    python -m bench fastpath            (callgrind around the driver below)
    python -m bench.bench_fastpath --drive [--module DIR]   (the driver alone)

CPU time on a shared two-core machine moves by tens of percent from one run to the next; the
instructions a fixed input costs do not. The driver opens `FLOWS` channels on 127.0.0.1 (a
listener socket, and per flow a client, a relay and a peer socket), routes them in a
`FastRelay`, and for `ROUNDS` rounds sends one 160-byte datagram per flow each way (ChannelData
from every client, plain UDP from every peer, as at media rate: one datagram per flow per
wake-up), then calls `poll()` until all are relayed. callgrind counts only inside
`FastRelay_poll` (the kernel's share of a syscall is not counted anywhere), so the figure is the
user-space cost of the relay itself: draining, route lookups, framing and the send calls.
`--module DIR` imports `_fastpath` from DIR instead (a build of a changed `_fastpath.c`), to set
two builds side by side.

A STUN Binding request is counted both ways: answered in C (`answer_binding`, where the build
has it; `BINDINGS` requests per round from the same clients, counted inside `FastRelay_poll`)
and by the engine in Python (`TurnEngine.handle_client`, the whole process counted for two
numbers of requests: the difference per request is the engine's cost, start-up cancelled out).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

FLOWS = int(os.environ.get("BENCH_FASTPATH_FLOWS", "200"))
ENGINE_REQUESTS = (200, 1200)
ROUNDS = int(os.environ.get("BENCH_FASTPATH_ROUNDS", "20"))
PAYLOAD = 160
CHANNEL = 0x4000
HOST = "127.0.0.1"
COLLECT = "FastRelay_poll"


def _module(path: str | None) -> ModuleType:
    if path:
        sys.path.insert(0, path)
        return importlib.import_module("_fastpath")  # a build under test
    from stunnerd import _fastpath as built

    return built


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((HOST, 0))
    s.setblocking(False)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return s


def _drain(socks: list[socket.socket]) -> int:
    got = 0
    for s in socks:
        while True:
            try:
                s.recv(2048)
            except BlockingIOError:
                break
            got += 1
    return got


def _binding_request(i: int) -> bytes:
    return struct.pack("!HHI", 0x0001, 0, 0x2112A442) + i.to_bytes(12, "big")


def drive_bindings(module_dir: str | None) -> dict[str, int]:
    """Binding requests answered in C: one per client per round."""
    fp = _module(module_dir)
    relay = fp.FastRelay()
    listener = _udp()
    relay.watch(listener.fileno(), fp.LISTENER, 0, 4096)
    relay.answer_binding(listener.fileno(), b"stunnerd")
    clients = [_udp() for _ in range(FLOWS)]
    polls = 0
    for r in range(ROUNDS):
        target = relay.stats()["answered"] + FLOWS
        for i, client in enumerate(clients):
            client.sendto(_binding_request(r * FLOWS + i), listener.getsockname())
        while relay.stats()["answered"] < target:
            select.select([relay.fileno()], [], [], 1.0)
            relay.poll()
            polls += 1
        _drain(clients)
    return {"answered": int(relay.stats()["answered"]), "polls": polls}


def drive_engine(count: int) -> dict[str, int]:
    """`count` Binding requests through the engine, as the Python path answers them."""
    from stunnerd.turn.engine import TurnEngine

    engine = TurnEngine(relay_ip="127.0.0.1", nonce_secret=b"k" * 32)
    answered = 0
    for i in range(count):
        answered += len(engine.handle_client(_binding_request(i), ("127.0.0.1", 40000), 0.0))
    return {"answered": answered}


def drive(module_dir: str | None) -> dict[str, int]:
    fp = _module(module_dir)
    relay = fp.FastRelay()
    listener = _udp()
    relay.watch(listener.fileno(), fp.LISTENER, 0)
    clients, relays, peers = [], [], []
    for _ in range(FLOWS):
        client, rsock, peer = _udp(), _udp(), _udp()
        relay.watch(rsock.fileno(), fp.RELAY, 0)
        c, p = client.getsockname(), peer.getsockname()
        lfd, rfd = listener.fileno(), rsock.fileno()
        relay.add_client_route(lfd, c[0], c[1], CHANNEL, rfd, p[0], p[1], 1)
        relay.add_peer_route(rfd, p[0], p[1], CHANNEL, lfd, c[0], c[1], 1)
        clients.append(client)
        relays.append(rsock)
        peers.append(peer)
    frame = struct.pack("!HH", CHANNEL, PAYLOAD) + bytes(PAYLOAD)
    to_listener = listener.getsockname()
    polls = 0
    for _ in range(ROUNDS):
        target = relay.stats()["relayed"] + 2 * FLOWS
        for client, rsock, peer in zip(clients, relays, peers, strict=True):
            client.sendto(frame, to_listener)
            peer.sendto(frame[4:], rsock.getsockname())
        while relay.stats()["relayed"] < target:
            select.select([relay.fileno()], [], [], 1.0)
            relay.poll()
            polls += 1
        _drain(clients + peers)
    stats = relay.stats()
    return {"relayed": int(stats["relayed"]), "missed": int(stats["missed"]), "polls": polls}


def _callgrind(module_dir: str | None, *drive: str) -> tuple[int, dict[str, int]]:
    """callgrind's instruction total for one driver run (inside COLLECT unless it drives the
    engine), and the driver's own report."""
    with tempfile.TemporaryDirectory(prefix="bench-fastpath-") as tmp:
        out = Path(tmp) / "callgrind.out"
        collect = [] if "--engine" in drive else [f"--toggle-collect={COLLECT}"]
        argv = [
            "valgrind", "--tool=callgrind", *collect, f"--callgrind-out-file={out}",
            sys.executable, "-m", "bench.bench_fastpath", "--drive", *drive,
        ]  # fmt: skip
        if module_dir:
            argv += ["--module", module_dir]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1]), result
    raise RuntimeError("callgrind wrote no totals")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_fastpath")
    parser.add_argument("--drive", action="store_true", help="run the driver itself")
    parser.add_argument("--module", help="import _fastpath from this directory")
    parser.add_argument("--bindings", action="store_true", help="drive Binding requests in C")
    parser.add_argument("--engine", type=int, help="drive this many Bindings through the engine")
    args = parser.parse_args(argv if argv is not None else [])
    if args.drive:
        if args.engine is not None:
            result = drive_engine(args.engine)
        else:
            result = drive_bindings(args.module) if args.bindings else drive(args.module)
        print(json.dumps(result), flush=True)
        return
    if not shutil.which("valgrind"):
        print("bench fastpath: valgrind not installed; skipped")
        return
    ir, result = _callgrind(args.module)
    relayed = max(1, result["relayed"])
    print(
        f"C fast path, {FLOWS} flows x {ROUNDS} rounds, one {PAYLOAD}-byte datagram per flow "
        f"each way per round: {result['relayed']} relayed, {result['missed']} missed, "
        f"{result['polls']} polls"
    )
    print(f"INSTRUCTIONS fastpath per relayed packet = {ir / relayed:.0f}  (in {COLLECT})")
    print(f"{relayed / max(1, result['polls']):.1f} packets per poll")
    report_bindings(args.module)


def report_bindings(module_dir: str | None) -> None:
    """Instructions per Binding request, in C where the build answers them, and in the engine."""
    low, high = (_callgrind(None, "--engine", str(n))[0] for n in ENGINE_REQUESTS)
    engine = (high - low) / (ENGINE_REQUESTS[1] - ENGINE_REQUESTS[0])
    print(f"INSTRUCTIONS binding engine per request = {engine:.0f}  (Python, whole process)")
    if not hasattr(_module(module_dir).FastRelay, "answer_binding"):
        print("this build does not answer Binding in C")
        return
    ir, result = _callgrind(module_dir, "--bindings")
    in_c = ir / max(1, result["answered"])
    print(f"INSTRUCTIONS binding fastpath per request = {in_c:.0f}  (in {COLLECT})")
    print(f"RATIO instructions_per_binding fastpath/engine = {in_c / engine:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
