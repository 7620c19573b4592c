"""What keeping allocations across a worker crash costs, and how long a crash is felt.

Two parts, loopback only and bounded:

* The journal, in process: a worker's `JournalWriter` and the supervisor's `Journal` over a real
  socket pair (`FdChannel`), for `ALLOCATIONS` allocations with one permission and one channel
  each: bytes per journaled change (a new allocation with its relay socket, a refresh), CPU per
  change on each side (`time.process_time`), and the supervisor's memory per allocation
  (tracemalloc, plus the one relay fd it holds).
* The restart window, end to end: stunnerd with 4 workers, `FLOWS` aioice clients each sending
  a numbered datagram every `INTERVAL_S` through a channel to an echo peer; one worker is killed
  with SIGKILL, `ROUNDS` times. Reported per kill: the window (kill until the replacement serves
  the listener in `/status`), datagrams lost (of those sent in the window) and the longest
  silence any client saw. Also the supervisor's CPU per journaled request (Refreshes), from
  /proc.
* The handoff window, end to end: the same clients through a stunnerd (one process, then 4
  workers) while a second one takes over through the handoff socket (`--handoff-idle`, as in a
  pod). Reported per handoff: the window (the new process started until the old one let go),
  datagrams lost (of those sent in the window), the longest silence a client saw, and the
  health probes refused on the shared health port (none expected: the socket is handed over).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench.fds import room_for_fds
from stunnerd.handoff.transport.journal import Journal, JournalWriter
from stunnerd.handoff.transport.records import record_json
from stunnerd.turn.allocation import Allocation, Channel
from stunnerd.workers.sockets import FdChannel

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from support.echo import udp_echo  # noqa: E402
from support.stunnerd_process import (  # noqa: E402
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)
from support.turn_flows import Flow, open_flows, send_steadily  # noqa: E402

ALLOCATIONS = 1000
REFRESHES = 5
END_TO_END_REFRESHES = 25
FLOWS = 20
INTERVAL_S = 0.02
ROUNDS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")


def allocation(i: int, now: float) -> Allocation:
    alloc = Allocation(
        ("203.0.113.7", 10000 + i), "user1", b"k" * 16, ("192.0.2.1", 40000 + i), 4, now + 600
    )
    alloc.permissions["10.0.0.5"] = now + 300
    alloc.channels[0x4001] = Channel(0x4001, ("10.0.0.5", 7000), now + 600)
    return alloc


def journal_cost() -> None:
    room_for_fds(2 * ALLOCATIONS)  # a relay socket each, and the journal's duplicate of it
    ours, theirs = FdChannel.pair()
    writer, journal = JournalWriter(FdChannel(theirs)), Journal()
    now = time.monotonic()
    allocs = [allocation(i, now) for i in range(ALLOCATIONS)]
    relays = []
    for _ in allocs:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        relays.append(sock)
    try:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        send = recv = 0.0
        for alloc, sock in zip(allocs, relays, strict=True):
            t0 = time.process_time()
            writer.changed("a", alloc.client, record_json(alloc, now), [sock.fileno()])
            t1 = time.process_time()
            journal.read(ours)
            send, recv = send + t1 - t0, recv + time.process_time() - t1
        created_bytes = journal.received_bytes / ALLOCATIONS
        gc.collect()
        memory = (tracemalloc.get_traced_memory()[0] - base) / ALLOCATIONS
        tracemalloc.stop()
        print(
            f"journal, new allocation: {created_bytes:.0f} B per message (+1 fd); worker "
            f"{send * 1e6 / ALLOCATIONS:.1f} us, supervisor {recv * 1e6 / ALLOCATIONS:.1f} us CPU; "
            f"supervisor memory {memory:.0f} B per allocation (+1 fd)"
        )
        before, send, recv = journal.received_bytes, 0.0, 0.0
        for _ in range(REFRESHES):
            for alloc in allocs:
                t0 = time.process_time()
                writer.changed("a", alloc.client, record_json(alloc, now), ())
                t1 = time.process_time()
                journal.read(ours)
                send, recv = send + t1 - t0, recv + time.process_time() - t1
        n = REFRESHES * ALLOCATIONS
        print(
            f"journal, change (refresh, permission, channel): "
            f"{(journal.received_bytes - before) / n:.0f} B per message; worker "
            f"{send * 1e6 / n:.1f} us, supervisor {recv * 1e6 / n:.1f} us CPU"
        )
    finally:
        journal.close()
        for sock in relays:
            sock.close()
        ours.close()
        theirs.close()


def own_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def kill_one(
    server: ManagedStunnerd, flows: list[Flow], peer: tuple[str, int], i: int
) -> None:
    index = (i + 1) % 4
    status = await server.status()
    victim = status["workers"][index]
    stop = asyncio.Event()
    sender = asyncio.create_task(send_steadily(flows, peer, stop, INTERVAL_S))
    for flow in flows:
        flow.sent.clear()
        flow.receiver.seen.clear()
    try:
        await asyncio.sleep(0.5)
        killed = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        await server.wait_status(
            lambda s: (
                s["workers"][index]["pid"] not in (None, victim["pid"])
                and all(w["listeners"] == 1 for w in s["workers"])
            ),
            "the replacement to serve",
        )
        back = time.monotonic()
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await sender
    await asyncio.sleep(1.0)
    window = sum(1 for f in flows for t in f.sent.values() if killed <= t <= back)
    lost = sum(len(f.lost()) for f in flows)
    gap = max(f.receiver.longest_gap(killed - 0.5) for f in flows)
    print(
        f"kill {i + 1}: worker {victim['index']} held {victim['allocations']} of {len(flows)}; "
        f"window {back - killed:.2f} s; lost {lost} of {window} sent in it; longest gap {gap:.2f} s"
    )


async def restart_window(tmp: Path) -> None:
    ports = listener_ports("a")
    server = ManagedStunnerd(tmp, base_config(health_port(), ports), "--udp-thread-num", "4")
    flows: list[Flow] = []
    try:
        # The backlog of the window arrives in one burst: room for it at the echo peer.
        async with udp_echo(receive_buffer_bytes=4 << 20) as echo:
            await server.ready()
            flows = await open_flows(FLOWS, ports["a"])
            await asyncio.gather(*(flow.bind(echo.addr) for flow in flows))
            pid = server.proc.proc.pid
            before = own_cpu_s(pid)
            for _ in range(END_TO_END_REFRESHES):
                assert await asyncio.gather(*(flow.refresh() for flow in flows)) == [0] * FLOWS
            spent = own_cpu_s(pid) - before
            print(
                f"supervisor CPU per journaled Refresh (all it did meanwhile, /proc ticks): "
                f"{spent * 1e6 / (END_TO_END_REFRESHES * FLOWS):.0f} us"
            )
            for i in range(ROUNDS):
                await kill_one(server, flows, echo.addr, i)
    finally:
        for flow in flows:
            flow.abandon()
        await server.close()


async def _probe_health(port: int, stop: asyncio.Event) -> tuple[int, int]:
    """(probes, refused) on the health port until `stop`."""
    probes = refused = 0
    while not stop.is_set():
        probes += 1
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
        except OSError:
            refused += 1
        await asyncio.sleep(0.01)
    return probes, refused


async def handoff_window(tmp: Path, workers: int) -> None:
    ports, health = listener_ports("a"), health_port()
    sock_path = tmp / f"handoff-{workers}" / "stunnerd.sock"
    args = ("--handoff-socket", str(sock_path), "--udp-thread-num", str(workers), "--handoff-idle")

    def stunnerd(name: str) -> ManagedStunnerd:
        home = tmp / f"{name}-{workers}"
        home.mkdir()
        return ManagedStunnerd(home, base_config(health, ports), *args)

    old, new = stunnerd("old"), None
    flows: list[Flow] = []
    try:
        async with udp_echo(receive_buffer_bytes=4 << 20) as echo:
            await old.ready()
            flows = await open_flows(FLOWS, ports["a"])
            await asyncio.gather(*(flow.bind(echo.addr) for flow in flows))
            stop = asyncio.Event()
            sender = asyncio.create_task(send_steadily(flows, echo.addr, stop, INTERVAL_S))
            prober = asyncio.create_task(_probe_health(health, stop))
            try:
                await asyncio.sleep(0.5)
                started = time.monotonic()
                new = stunnerd("new")
                while "idle until SIGTERM" not in old.proc.output():
                    if not old.proc.alive() or not new.proc.alive():
                        raise RuntimeError(f"handoff failed:\n{new.log()}")
                    await asyncio.sleep(0.01)
                handed = time.monotonic()
                await asyncio.sleep(0.5)
            finally:
                stop.set()
                await sender
                probes, refused = await prober
            await asyncio.sleep(1.0)
        window = sum(1 for f in flows for t in f.sent.values() if started <= t <= handed)
        lost = sum(len(f.lost()) for f in flows)
        gap = max(f.receiver.longest_gap(started - 0.5) for f in flows)
        print(
            f"handoff ({workers or 1} process{'es' if workers else ''}): window "
            f"{handed - started:.2f} s; lost {lost} of {window} sent in it; longest gap "
            f"{gap:.2f} s; health probes refused {refused} of {probes}"
        )
    finally:
        for flow in flows:
            flow.abandon()
        if new is not None:
            await new.close()
        await old.close()


def main() -> None:
    journal_cost()
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        asyncio.run(restart_window(Path(tmp)))
        for workers in (0, 4):
            asyncio.run(handoff_window(Path(tmp), workers))


if __name__ == "__main__":
    main()
