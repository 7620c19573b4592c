"""Soak: 1000 TURN allocations churning through stunnerd's server for 10 minutes.

The server is stunnerd's `TurnServer` (the in-process fixture) alone in a child process, which
reports its RSS, open fds and asyncio tasks every few seconds. RFC 8656 gives an allocation at
least 600 s; to see abandoned allocations expire within the run, the child lowers that floor to
the 12 s the clients ask for (time compressed 50 times for expiry; nothing else is changed).

The driver keeps 1000 allocation slots busy with aioice clients: each allocates (lifetime 12 s),
binds a channel to a UDP echo peer, relays a datagram every 2 s long enough to be refreshed once,
then either deletes its allocation or abandons it so that the server expires it; then the slot
starts over.

The figures: RSS at the end against RSS after the warm-up (the first 2 minutes; must grow less
than 5 %), and fds and tasks once every allocation is gone against the baseline before the load
(must be equal). There is no peer to compare with here: the figure is the growth.

    python -m bench soak                     # 10 minutes
    BENCH_SOAK_SECONDS=120 BENCH_SOAK_SLOTS=200 python -m bench soak
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SECONDS = float(os.environ.get("BENCH_SOAK_SECONDS", "600"))
WARMUP_S = float(os.environ.get("BENCH_SOAK_WARMUP_SECONDS", str(min(120.0, SECONDS / 5))))
SLOTS = int(os.environ.get("BENCH_SOAK_SLOTS", "1000"))
LIFETIME_S = 12
PACKET_EVERY_S = 2.0
REPORT_EVERY_S = 5.0
USER, PASSWORD = "user1", "passwd1"


# ------------------------------------------------------------------------------- the server


def _sample(allocations: int) -> dict[str, Any]:
    rss_kb = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return {
        "t": time.monotonic(),
        "rss_kb": rss_kb,
        "fds": len(os.listdir("/proc/self/fd")),
        "tasks": len(asyncio.all_tasks()),
        "allocations": allocations,
    }


async def serve() -> None:
    """The child: a TurnServer on a free port; prints its port, then a sample every few s."""
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.stunnerd.inproc import make_config, running_server

    from stunnerd.turn import allocation

    allocation.DEFAULT_LIFETIME_S = LIFETIME_S

    config = make_config(("TURN-UDP",))
    async with running_server(config) as server:
        print(json.dumps({"port": config.listeners[0].port}), flush=True)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        stop = asyncio.ensure_future(reader.read())  # EOF on stdin: stop
        while not stop.done():
            print(json.dumps(_sample(server.allocation_count)), flush=True)
            await asyncio.wait([stop], timeout=REPORT_EVERY_S)


# ------------------------------------------------------------------------------- the driver


class _Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.transport.sendto(data, addr)


class _Counter(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received = 0

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.received += 1


class Driver:
    def __init__(self, port: int, peer: tuple[str, int], deadline: float) -> None:
        self.server = ("127.0.0.1", port)
        self.peer = peer
        self.deadline = deadline
        self.rng = random.Random(15)
        self.allocations = self.deleted = self.abandoned = self.failures = 0
        self.sent = self.echoed = 0
        self.failure_kinds: dict[str, int] = {}

    async def slot(self, delay_s: float) -> None:
        from aioice.turn import create_turn_endpoint

        await asyncio.sleep(delay_s)
        while time.monotonic() < self.deadline:
            try:
                async with asyncio.timeout(20):
                    transport, counter = await create_turn_endpoint(
                        _Counter,
                        server_addr=self.server,
                        username=USER,
                        password=PASSWORD,
                        lifetime=LIFETIME_S,
                    )
            except Exception as exc:
                self.failures += 1
                kind = type(exc).__name__
                self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + 1
                await asyncio.sleep(1.0)
                continue
            self.allocations += 1
            packets = self.rng.randint(6, 9)  # 12-18 s: past the refresh at 10 s
            for _ in range(packets):
                transport.sendto(b"soak" * 10, self.peer)
                self.sent += 1
                await asyncio.sleep(PACKET_EVERY_S)
            self.echoed += counter.received
            if self.rng.random() < 0.5:
                transport.close()  # Refresh with lifetime 0
                self.deleted += 1
            else:  # vanish: the server expires the allocation
                inner = transport._TurnTransport__inner_protocol  # type: ignore[attr-defined]
                if inner.refresh_task is not None:
                    inner.refresh_task.cancel()
                if inner.transport is not None:
                    inner.transport.close()
                self.abandoned += 1


async def drive() -> dict[str, Any]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.bench_soak",
        "--serve",
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    samples: list[dict[str, Any]] = []
    port = json.loads(await child.stdout.readline())["port"]

    async def read_samples() -> None:
        assert child.stdout is not None
        while line := await child.stdout.readline():
            samples.append(json.loads(line))

    reader = asyncio.create_task(read_samples())
    loop = asyncio.get_running_loop()
    echo, _ = await loop.create_datagram_endpoint(_Echo, local_addr=("127.0.0.1", 0))
    try:
        await asyncio.sleep(REPORT_EVERY_S + 1)
        baseline = samples[-1]
        started = time.monotonic()
        driver = Driver(port, echo.get_extra_info("sockname")[:2], started + SECONDS)
        ramp_s = min(30.0, SECONDS / 10)
        slots = [
            asyncio.create_task(driver.slot(ramp_s * i / SLOTS), name=f"soak-slot-{i}")
            for i in range(SLOTS)
        ]
        await asyncio.gather(*slots)
        load_end = samples[-1]
        warm = [s for s in samples if s["t"] >= baseline["t"] + WARMUP_S]
        # every allocation gone: deleted ones at once, abandoned ones after their lifetime
        drained_by = time.monotonic() + LIFETIME_S + 15
        while samples[-1]["allocations"] and time.monotonic() < drained_by:  # noqa: ASYNC110
            await asyncio.sleep(1)  # the child reports every few seconds: poll its samples
        await asyncio.sleep(REPORT_EVERY_S + 1)
        after = samples[-1]
    finally:
        echo.close()
        child.stdin.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await child.wait()
        if child.returncode is None:
            child.kill()
            await child.wait()
        reader.cancel()
    return {
        "baseline": baseline,
        "warm": warm[0] if warm else load_end,
        "load_end": load_end,
        "after": after,
        "peak_allocations": max(s["allocations"] for s in samples),
        "driver": driver.__dict__ | {"rng": None, "server": None, "peer": None},
    }


def main() -> None:
    result = asyncio.run(drive())
    base, warm, end, after = result["baseline"], result["warm"], result["load_end"], result["after"]
    growth = 100.0 * (end["rss_kb"] - warm["rss_kb"]) / warm["rss_kb"]
    d = result["driver"]
    print(
        f"soak: {SECONDS:.0f} s, {SLOTS} slots, {d['allocations']} allocations "
        f"({d['deleted']} deleted, {d['abandoned']} left to expire, {d['failures']} failed), "
        f"peak {result['peak_allocations']} live, {d['echoed']}/{d['sent']} datagrams echoed"
    )
    if d["failure_kinds"]:
        print(f"soak: failed allocations by error: {d['failure_kinds']}")
    print(
        f"soak: RSS {base['rss_kb'] / 1024:.1f} MiB before, {warm['rss_kb'] / 1024:.1f} after "
        f"warm-up, {end['rss_kb'] / 1024:.1f} at the end: growth {growth:+.2f} % (limit 5 %)"
    )
    print(
        f"soak: fds {base['fds']} before, {end['fds']} under load, {after['fds']} after; "
        f"tasks {base['tasks']} before, {end['tasks']} under load, {after['tasks']} after; "
        f"allocations left {after['allocations']}"
    )
    problems = []
    if growth >= 5.0:
        problems.append(f"RSS grew {growth:.2f} %")
    if after["fds"] > base["fds"]:
        problems.append(f"fds {base['fds']} -> {after['fds']}")
    if after["tasks"] > base["tasks"]:
        problems.append(f"tasks {base['tasks']} -> {after['tasks']}")
    if after["allocations"]:
        problems.append(f"{after['allocations']} allocations never expired")
    if problems:
        raise SystemExit("soak failed: " + "; ".join(problems))


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        asyncio.run(serve())
    else:
        main()
