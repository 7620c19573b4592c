"""A paced TURN-UDP probe built on aioice's client: one allocation, one channel to an echo peer.

    python tests/support/turn_probe.py HOST PORT USER PASSWORD PEER_HOST PEER_PORT \
        [--count N] [--interval-ms MS] [--size BYTES]

Once the channel echoes it prints `ready`, then sends `count` datagrams through the channel at a
fixed pace, each carrying its sequence number and send time, and prints one JSON line: sent,
received, lost, duplicates, RTT p50/p99 (ms) and the relay address. Run inside a network
namespace by the offload tests (an independent TURN client against stunnerd) and by
`python -m bench offload` (the latency probe under load).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import struct
import sys
import time

from aioice import turn

_HEADER = struct.Struct("!Qd")
SETTLE_S = 1.0


BIND_SEQ = 2**63
BIND_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 5.0


class _Echoes(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.rtts: dict[int, float] = {}
        self.duplicates = 0
        self.expected = 0
        self.all_in = asyncio.Event()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) < _HEADER.size:
            return
        seq, sent = _HEADER.unpack_from(data)
        if seq in self.rtts:
            self.duplicates += 1
        self.rtts[seq] = (time.monotonic() - sent) * 1000.0
        if len(self.rtts) >= self.expected > 0:
            self.all_in.set()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def probe(args: argparse.Namespace) -> dict[str, object]:
    transport, echoes = await turn.create_turn_endpoint(
        _Echoes, (args.host, args.port), args.user, args.password, transport="udp"
    )
    try:
        peer = (args.peer_host, args.peer_port)
        relay = transport.get_extra_info("sockname")
        pad = b"\0" * max(0, args.size - _HEADER.size)
        loop = asyncio.get_running_loop()
        # The first send binds the channel; its echo says the path works end to end.
        deadline = loop.time() + BIND_TIMEOUT_S
        while BIND_SEQ not in echoes.rtts and loop.time() < deadline:
            transport.sendto(_HEADER.pack(BIND_SEQ, time.monotonic()) + pad, peer)
            await asyncio.sleep(0.1)
        if BIND_SEQ not in echoes.rtts:
            raise TimeoutError("no echo through the channel")
        print("ready", flush=True)
        echoes.expected = args.count + 1
        start = loop.time()
        for seq in range(args.count):
            await asyncio.sleep(max(0.0, start + seq * args.interval_ms / 1000.0 - loop.time()))
            transport.sendto(_HEADER.pack(seq, time.monotonic()) + pad, peer)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTLE_S):
                await echoes.all_in.wait()
    finally:
        transport.close()  # Refresh with lifetime 0
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await echoes.closed
    rtts = [v for k, v in echoes.rtts.items() if k != BIND_SEQ]
    return {
        "sent": args.count,
        "received": len(rtts),
        "lost": args.count - len(rtts),
        "duplicates": echoes.duplicates,
        "rtt_p50_ms": round(percentile(rtts, 0.50), 3),
        "rtt_p99_ms": round(percentile(rtts, 0.99), 3),
        "relay": f"{relay[0]}:{relay[1]}" if relay else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("user")
    parser.add_argument("password")
    parser.add_argument("peer_host")
    parser.add_argument("peer_port", type=int)
    parser.add_argument("--count", type=int, default=250)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--size", type=int, default=160)
    args = parser.parse_args(argv)
    result = asyncio.run(asyncio.wait_for(probe(args), timeout=args.count * 0.1 + 30))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
