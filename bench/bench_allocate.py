"""What one TURN allocation costs stunnerd's request path, in-process, in a tight loop.

The allocation storm of `bench turn` measures whole processes over UDP, on a machine whose cores
it shares with its clients. This drives one TURN-UDP listener the way a stunnerd process runs it
(`UdpListener` with the C relay where it was built, static credentials, no challenge budget),
without the clients: per allocation, the storm's two requests go straight to
`client_slow_path` (where the C relay hands them over), an unauthenticated Allocate answered
401 and an authenticated one answered once its relay socket is open. (Over UDP the C relay
answers the first itself, `stunnerd.fastpath.FastPath.answer_challenges`; the engine's 401 fed
here is what a TCP, TLS or DTLS listener runs, and a UDP one without the C relay.) The answers
go out of the listener's socket to addresses nobody reads. Requests are built beforehand, each
with a nonce of its own, so the figures are the server's: CPU per allocation
(`time.process_time`, best of `ROUNDS`).

For figures that do not depend on a noisy machine, `--count K` makes K of `--prepare`
allocations: run it under `valgrind --tool=callgrind` with K = 0 and K = the prepared count, and
the difference of the instruction counts over K is the cost per allocation (`--callgrind` does
that and prints the figure).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import time
from pathlib import Path

from bench import callgrind as cg
from bench.alloc_storm import allocate_request, long_term_key
from bench.fds import room_for_fds
from stunnerd import fastpath
from stunnerd.net.guard import ClientLimits
from stunnerd.net.listener import ListenerContext, ListenerOptions, ListenerSpec
from stunnerd.net.udp import UdpListener
from stunnerd.turn.guard import RequestLimits
from stunnerd.turn.policies import (
    AllowAllPeers,
    Policies,
    StaticAuthenticator,
    UserQuota,
    UserUsage,
)

ALLOCATIONS = 2000
BATCH = 20
ROUNDS = 5
REALM, USER, PASSWORD = "stunner.l7mp.io", "user1", "pass1"

Client = tuple[str, int]
Pair = tuple[bytes, bytes, Client]


async def _listener() -> UdpListener:
    loop = asyncio.get_running_loop()
    spec = ListenerSpec("default/udp-gateway/udp-listener", "TURN-UDP", "127.0.0.1", 0, "127.0.0.1")
    policies = Policies(StaticAuthenticator(REALM, USER, PASSWORD), AllowAllPeers(), UserQuota())
    options = ListenerOptions(limits=ClientLimits(RequestLimits(challenge_rate_per_s=0)))
    listener = UdpListener(
        spec, policies, options, ListenerContext(loop, UserUsage()), nonce_secret=bytes(32)
    )
    make_fastpath = fastpath.factory()
    if make_fastpath is not None:
        listener.fastpath = make_fastpath(loop)
    await listener.start()
    return listener


def _pairs(listener: UdpListener, count: int, now: float) -> list[Pair]:
    """The storm's requests: a fresh client port each, a nonce of its own (as every 401
    mints one, each authenticated request brings one the listener has not verified yet)."""
    nonces = listener.engine.requests.gate.nonces
    key = long_term_key(USER, REALM, PASSWORD)
    pairs = []
    for i in range(count):
        tid = hashlib.sha1(i.to_bytes(4, "big")).digest()[:12]
        nonce = nonces.issue(now - 30.0 + i * 0.002)
        signed = allocate_request(tid[::-1], username=USER, realm=REALM, nonce=nonce, key=key)
        client = ("127.0.0.1", 20000 + i)  # the storm's clients share one IP
        pairs.append((allocate_request(tid), signed, client))
    return pairs


async def _run(listener: UdpListener, pairs: list[Pair], batch: int) -> None:
    """Both requests of each allocation, `batch` allocations per event-loop turn, until every
    relay is open."""
    handle = listener.client_slow_path
    for start in range(0, len(pairs), batch):
        for first, second, client in pairs[start : start + batch]:
            handle(first, client)
            handle(second, client)
        await asyncio.gather(*listener.opener.tasks.tasks)


async def _close(listener: UdpListener) -> None:
    await listener.close()
    if listener.fastpath is not None:
        listener.fastpath.close()


async def one_round(count: int, batch: int) -> float:
    """CPU seconds for `count` allocations."""
    listener = await _listener()
    try:
        pairs = _pairs(listener, count, asyncio.get_running_loop().time())
        t0 = time.process_time()
        await _run(listener, pairs, batch)
        spent = time.process_time() - t0
        assert listener.allocation_count == count, listener.allocation_count
    finally:
        await _close(listener)
    return spent


def timings(count: int = ALLOCATIONS, batch: int = BATCH, rounds: int = ROUNDS) -> None:
    room_for_fds(count)
    best = min(asyncio.run(one_round(count, batch)) for _ in range(rounds))
    print(
        f"allocate, {count} allocations (401, then authenticated) in batches of {batch}: "
        f"{best / count * 1e6:.1f} us CPU per allocation (best of {rounds}; "
        f"C relay {'on' if fastpath.available() else 'off'})"
    )


async def count_run(prepare: int, count: int, batch: int) -> None:
    """Make `count` of `prepare` allocations (built either way)."""
    listener = await _listener()
    try:
        pairs = _pairs(listener, prepare, asyncio.get_running_loop().time())
        await _run(listener, pairs[:count], batch)
        assert listener.allocation_count == count, listener.allocation_count
    finally:
        await _close(listener)


def callgrind(prepare: int, batch: int) -> None:
    """Instructions per allocation, from two runs under callgrind."""
    totals = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in (0, prepare):
            out = Path(tmp, f"cg.{count}")
            cg.run("bench.bench_allocate", str(out), prepare, count, batch)
            totals.append(cg.instructions(out))
    base, full = totals
    print(f"allocate: {(full - base) / prepare:.0f} instructions per allocation")


def main() -> None:
    timings()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.bench_allocate", description=__doc__)
    parser.add_argument("--prepare", type=int, default=1000)
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--allocations", type=int, default=ALLOCATIONS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    if args.callgrind:
        callgrind(args.prepare, args.batch)
    elif args.count is not None:
        room_for_fds(args.prepare)
        asyncio.run(count_run(args.prepare, args.count, args.batch))
    else:
        timings(args.allocations, args.batch, args.rounds)
