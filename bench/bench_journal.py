"""What the workers' allocation journal costs per allocation, on each side, in a tight loop.

A worker journals each new allocation (`records.RecordJournal` over `journal.JournalWriter`,
with a duplicate of its relay socket) and sends the changes of one event-loop turn as one
message; the supervisor reads them (`journal.Journal.read`) and keeps each allocation. This runs
both sides over a real socket pair (`FdChannel`) for `ALLOCATIONS` new allocations in batches of
`BATCH` (about what a storm's turn holds), and reports the CPU per allocation of each side
(`time.process_time`, best of `ROUNDS`).

For figures that do not depend on a noisy machine, `--count K` runs the two sides in two
processes (the worker forked off), journaling K of `--prepare` allocations: run it under
`valgrind --tool=callgrind --callgrind-out-file=cg.%p` with K = 0 and K = the prepared count,
and the difference of each process's instruction count over K is its cost per allocation
(`--callgrind` does all of that and prints the two figures).
"""

from __future__ import annotations

import argparse
import os
import re
import select
import socket
import sys
import tempfile
import time
from pathlib import Path

from bench import callgrind as cg
from bench.fds import room_for_fds
from stunnerd.handoff.transport.journal import Journal, JournalWriter
from stunnerd.handoff.transport.records import RecordJournal
from stunnerd.turn.allocation import Allocation
from stunnerd.workers.sockets import FdChannel

ALLOCATIONS = 3000
BATCH = 6
ROUNDS = 5
LISTENER = "default/udp-gateway/udp-listener"


def allocations(count: int, now: float) -> list[Allocation]:
    """New allocations as a storm makes them: no permission or channel yet."""
    return [
        Allocation(
            (f"10.0.{i // 250 % 250}.{i % 250 + 1}", 20000 + i % 40000),
            "user1",
            bytes(range(16)),
            ("10.0.0.1", 30000 + i % 30000),
            4,
            now + 600.0,
            "user1",
        )
        for i in range(count)
    ]


def one_round(allocs: list[Allocation], now: float, batch: int) -> tuple[float, float]:
    """CPU seconds of the worker's side and of the supervisor's for `allocs`."""
    ours, theirs = FdChannel.pair()
    writer = JournalWriter(FdChannel(theirs), lambda _flush: None)
    records, journal = RecordJournal(writer), Journal()
    relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fds = (relay.fileno(),)
    worker = supervisor = 0.0
    try:
        for start in range(0, len(allocs), batch):
            t0 = time.process_time()
            for alloc in allocs[start : start + batch]:
                records.changed(LISTENER, alloc, now, fds)
            writer.flush()
            t1 = time.process_time()
            journal.read(ours)
            t2 = time.process_time()
            worker, supervisor = worker + t1 - t0, supervisor + t2 - t1
        assert len(journal) == len(allocs)
    finally:
        journal.close()
        relay.close()
        ours.close()
        theirs.close()
    return worker, supervisor


def timings(count: int = ALLOCATIONS, batch: int = BATCH, rounds: int = ROUNDS) -> None:
    room_for_fds(count)
    now = time.monotonic()
    allocs = allocations(count, now)
    results = [one_round(allocs, now, batch) for _ in range(rounds)]
    worker = min(w for w, _s in results) / count
    supervisor = min(s for _w, s in results) / count
    print(
        f"journal, {count} new allocations in batches of {batch}: worker "
        f"{worker * 1e6:.2f} us, supervisor {supervisor * 1e6:.2f} us CPU per allocation "
        f"(best of {rounds})"
    )


def count_run(prepare: int, count: int, batch: int) -> None:
    """Fork: the child journals `count` of `prepare` allocations, the parent reads them."""
    room_for_fds(prepare)
    now = time.monotonic()
    allocs = allocations(prepare, now)
    ours, theirs = FdChannel.pair()
    relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    pid = os.fork()
    if pid == 0:
        ours.close()
        writer = JournalWriter(FdChannel(theirs), lambda _flush: None)
        records = RecordJournal(writer)
        fds = (relay.fileno(),)
        for start in range(0, count, batch):
            for alloc in allocs[start : min(start + batch, count)]:
                records.changed(LISTENER, alloc, now, fds)
            writer.flush()
        theirs.close()
        print(f"worker {os.getpid()}", file=sys.stderr, flush=True)
        os._exit(0)
    theirs.close()
    journal = Journal()
    while True:
        select.select([ours.sock], [], [])
        journal.read(ours)
        try:
            if not ours.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                break
        except BlockingIOError:
            continue
    os.waitpid(pid, 0)
    assert len(journal) == count, (len(journal), count)
    journal.close()
    print(f"supervisor {os.getpid()}", file=sys.stderr, flush=True)


def callgrind(prepare: int, batch: int) -> None:
    """Instructions per allocation of each side, from two runs under callgrind."""
    side: dict[str, list[int]] = {"worker": [], "supervisor": []}
    with tempfile.TemporaryDirectory() as tmp:
        for count in (0, prepare):
            stderr = cg.run("bench.bench_journal", f"{tmp}/cg.{count}.%p", prepare, count, batch)
            for name, pid in re.findall(r"^(worker|supervisor) (\d+)$", stderr, re.M):
                side[name].append(cg.instructions(Path(tmp, f"cg.{count}.{pid}")))
    for name, (base, full) in side.items():
        print(f"journal, {name}: {(full - base) / prepare:.0f} instructions per allocation")


def main() -> None:
    timings()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.bench_journal", description=__doc__)
    parser.add_argument("--prepare", type=int, default=2000)
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--allocations", type=int, default=ALLOCATIONS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    if args.callgrind:
        callgrind(args.prepare, args.batch)
    elif args.count is not None:
        count_run(args.prepare, args.count, args.batch)
    else:
        timings(args.allocations, args.batch, args.rounds)
