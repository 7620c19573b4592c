"""Soak: 1000 TURN allocations churning through stunnerd's server for 10 minutes.

The server is stunnerd's `TurnServer` (the in-process fixture) alone in a child process, which
reports its RSS, open fds and asyncio tasks every few seconds. RFC 8656 gives an allocation at
least 600 s; to see abandoned allocations expire within the run, the child lowers that floor to
the 12 s the clients ask for (time compressed 50 times for expiry; nothing else is changed).

The driver keeps 1000 allocation slots busy from one event loop (non-blocking UDP sockets, one
timer per slot, aioice's STUN codec): each slot allocates (lifetime 12 s), binds a channel to a
UDP echo peer, relays a datagram every 2 s for 12-18 s with a Refresh every 6 s, then either
deletes its allocation or abandons it so that the server expires it; then the slot starts over
on a new socket. A TURN client object and a task per allocation starved the driver at ~470.

The figures: RSS at the end against RSS after the warm-up (the first 2 minutes; must grow less
than 5 %), and fds and tasks once every allocation is gone against the baseline before the load
(must be equal). There is no peer to compare with here: the figure is the growth.

    python -m bench soak                     # 10 minutes
    BENCH_SOAK_SECONDS=120 BENCH_SOAK_SLOTS=200 python -m bench soak
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import struct
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

CHANNEL = 0x4000
RTO_S = 1.0
TRIES = 5
REFRESH_EVERY_S = LIFETIME_S / 2


class _Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.transport.sendto(data, addr)


class _Client(asyncio.DatagramProtocol):
    """One slot's socket and the state of its current allocation (a new socket per cycle).

    The states: ``alloc`` (the unauthenticated Allocate, answered 401), ``auth`` (the signed
    Allocate), ``bind`` (ChannelBind to the echo peer), ``active`` (a ChannelData every 2 s and
    a Refresh every half lifetime), ``delete`` (Refresh with lifetime 0), ``off``.
    """

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.transport: asyncio.DatagramTransport | None = None
        self.state = "off"
        self.tid = b""
        self.request = b""
        self.tries = 0
        self.timer: asyncio.TimerHandle | None = None
        self.nonce = b""
        self.realm = ""
        self.key = b""
        self.packets_left = 0
        self.next_refresh = 0.0
        self.cycles = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.driver.received(self, data)

    def error_received(self, exc: Exception) -> None:
        self.driver.failed(self, type(exc).__name__)


class Driver:
    """Every slot in one event loop: non-blocking UDP sockets, STUN messages built and parsed
    with aioice's codec, and one timer per slot (retransmission or the next packet) instead of
    a task and a TURN client object per allocation."""

    def __init__(self, port: int, peer: tuple[str, int], deadline: float, slots: int) -> None:
        from aioice import stun

        self.stun = stun
        self.loop = asyncio.get_running_loop()
        self.server = ("127.0.0.1", port)
        self.peer = peer
        self.deadline = deadline
        self.rng = random.Random(15)
        self.clients = [_Client(self) for _ in range(slots)]
        self.allocations = self.deleted = self.abandoned = self.failures = 0
        self.sent = self.echoed = self.live = self.peak_live = 0
        self.failure_kinds: dict[str, int] = {}
        self.live_samples: list[tuple[float, int]] = []
        self.done = asyncio.Event()
        self._running = slots

    # -- cycle

    async def start(self, client: _Client, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self._open(client)

    async def _open(self, client: _Client) -> None:
        if time.monotonic() >= self.deadline:
            self._retire(client)
            return
        try:
            await self.loop.create_datagram_endpoint(lambda: client, local_addr=("127.0.0.1", 0))
        except OSError as exc:
            self._count_failure(type(exc).__name__)
            self._later(client, 1.0, self._reopen)
            return
        client.cycles += 1
        client.state = "alloc"
        self._request(client, self._allocate(client, signed=False))

    def _reopen(self, client: _Client) -> None:
        self.loop.create_task(self._open(client))

    def _retire(self, client: _Client) -> None:
        client.state = "off"
        self._running -= 1
        if self._running == 0:
            self.done.set()

    def _end_cycle(self, client: _Client, *, delete: bool) -> None:
        if client.state == "active":
            self.live -= 1
        self._cancel(client)
        if delete:
            client.state = "delete"
            self._request(client, self._refresh(client, lifetime=0))
            return
        self._close(client)
        self._reopen(client)

    def _close(self, client: _Client) -> None:
        self._cancel(client)
        client.state = "off"
        if client.transport is not None:
            client.transport.close()
            client.transport = None

    # -- messages

    def _message(self, method: Any, attributes: dict[str, Any], client: _Client) -> Any:
        stun = self.stun
        msg = stun.Message(method, stun.Class.REQUEST, attributes=attributes)
        if client.key:
            msg.attributes["USERNAME"] = USER
            msg.attributes["REALM"] = client.realm
            msg.attributes["NONCE"] = client.nonce
            msg.add_message_integrity(client.key)
        return msg

    def _allocate(self, client: _Client, *, signed: bool) -> Any:
        if not signed:
            client.key = b""
        attrs = {"REQUESTED-TRANSPORT": 17 << 24, "LIFETIME": LIFETIME_S}
        return self._message(self.stun.Method.ALLOCATE, attrs, client)

    def _refresh(self, client: _Client, *, lifetime: int) -> Any:
        return self._message(self.stun.Method.REFRESH, {"LIFETIME": lifetime}, client)

    def _channel_bind(self, client: _Client) -> Any:
        attrs = {"CHANNEL-NUMBER": CHANNEL, "XOR-PEER-ADDRESS": self.peer}
        return self._message(self.stun.Method.CHANNEL_BIND, attrs, client)

    def _request(self, client: _Client, msg: Any) -> None:
        client.tid = msg.transaction_id
        client.request = bytes(msg)
        client.tries = 0
        self._transmit(client)

    def _transmit(self, client: _Client) -> None:
        if client.transport is None:
            return
        if client.tries == TRIES:
            self.failed(client, f"no answer to {client.state}")
            return
        client.tries += 1
        client.transport.sendto(client.request, self.server)
        self._later(client, RTO_S * client.tries, self._transmit)

    def _later(self, client: _Client, delay_s: float, then: Any) -> None:
        self._cancel(client)
        client.timer = self.loop.call_later(delay_s, then, client)

    def _cancel(self, client: _Client) -> None:
        if client.timer is not None:
            client.timer.cancel()
            client.timer = None

    # -- events

    def received(self, client: _Client, data: bytes) -> None:
        if data[:1] and data[0] & 0xC0 == 0x40:  # ChannelData (RFC 8656 §12.4)
            self.echoed += 1
            return
        try:
            msg = self.stun.parse_message(data)
        except ValueError:
            self.failed(client, "unparsable answer")
            return
        if msg.transaction_id != client.tid:
            return  # an answer to a retransmission already answered
        if msg.message_class == self.stun.Class.ERROR:
            code = msg.attributes.get("ERROR-CODE", (0, ""))[0]
            if code == 401 and client.state == "alloc":
                client.realm = msg.attributes["REALM"]
                client.nonce = msg.attributes["NONCE"]
                key = f"{USER}:{client.realm}:{PASSWORD}".encode()
                client.key = hashlib.md5(key).digest()
                client.state = "auth"
                self._request(client, self._allocate(client, signed=True))
            elif code == 438:  # stale nonce: the same request with the new one
                client.nonce = msg.attributes["NONCE"]
                method = msg.message_method
                again = self.stun.parse_message(client.request)
                attrs = {
                    k: v
                    for k, v in again.attributes.items()
                    if k not in ("USERNAME", "REALM", "NONCE", "MESSAGE-INTEGRITY", "FINGERPRINT")
                }
                self._request(client, self._message(method, attrs, client))
            else:
                self.failed(client, f"{client.state}: error {code}")
            return
        self._cancel(client)
        if client.state == "auth":
            self.allocations += 1
            client.state = "bind"
            self._request(client, self._channel_bind(client))
        elif client.state == "bind":
            client.state = "active"
            self.live += 1
            self.peak_live = max(self.peak_live, self.live)
            client.packets_left = self.rng.randint(6, 9)  # 12-18 s: refreshed at least twice
            client.next_refresh = time.monotonic() + REFRESH_EVERY_S
            self._tick(client)
        elif client.state == "active":
            self._later(client, PACKET_EVERY_S, self._tick)  # a Refresh answered
        elif client.state == "delete":
            self.deleted += 1
            self._close(client)
            self._reopen(client)

    def _tick(self, client: _Client) -> None:
        """The next datagram, a Refresh when due, or the end of this allocation."""
        client.timer = None
        if client.transport is None:
            return
        if client.packets_left == 0 or time.monotonic() >= self.deadline:
            delete = self.rng.random() < 0.5
            if not delete:
                self.abandoned += 1  # vanish: the server expires the allocation
            self._end_cycle(client, delete=delete)
            return
        client.packets_left -= 1
        header = struct.pack("!HH", CHANNEL, len(PAYLOAD))
        client.transport.sendto(header + PAYLOAD, self.server)
        self.sent += 1
        if time.monotonic() >= client.next_refresh:
            client.next_refresh += REFRESH_EVERY_S
            self._request(client, self._refresh(client, lifetime=LIFETIME_S))
            return  # the answer schedules the next tick
        self._later(client, PACKET_EVERY_S, self._tick)

    def failed(self, client: _Client, kind: str) -> None:
        self._count_failure(kind)
        if client.state == "active":
            self.live -= 1
        self._close(client)
        self._later(client, 1.0, self._reopen)

    def _count_failure(self, kind: str) -> None:
        self.failures += 1
        self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + 1

    async def run(self, ramp_s: float) -> None:
        starters = [
            asyncio.create_task(self.start(c, ramp_s * i / len(self.clients)), name=f"soak-{i}")
            for i, c in enumerate(self.clients)
        ]
        try:
            while not self.done.is_set():
                self.live_samples.append((time.monotonic(), self.live))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self.done.wait()
        finally:
            for task in starters:
                task.cancel()
            for client in self.clients:
                self._close(client)

    def summary(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in self.__dict__.items()
            if isinstance(v, int | dict) and k not in ("clients", "_running")
        }


PAYLOAD = b"soak" * 10


async def drive(
    seconds: float = SECONDS, slots: int = SLOTS, warmup_s: float = WARMUP_S
) -> dict[str, Any]:
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
        driver = Driver(port, echo.get_extra_info("sockname")[:2], started + seconds, slots)
        ramp_s = min(30.0, seconds / 10)
        await driver.run(ramp_s)
        load_end = samples[-1]
        warm = [s for s in samples if s["t"] >= baseline["t"] + warmup_s]
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
    steady = [
        live
        for t, live in driver.live_samples
        if started + ramp_s + LIFETIME_S <= t < started + seconds
    ]
    return {
        "baseline": baseline,
        "warm": warm[0] if warm else load_end,
        "load_end": load_end,
        "after": after,
        "samples": samples,
        "peak_allocations": max(s["allocations"] for s in samples),
        "steady_live": (min(steady), sum(steady) / len(steady)) if steady else (0, 0.0),
        "driver": driver.summary(),
    }


def main() -> None:
    result = asyncio.run(drive())
    base, warm, end, after = result["baseline"], result["warm"], result["load_end"], result["after"]
    growth = 100.0 * (end["rss_kb"] - warm["rss_kb"]) / warm["rss_kb"]
    d = result["driver"]
    print(
        f"soak: {SECONDS:.0f} s, {SLOTS} slots, {d['allocations']} allocations "
        f"({d['deleted']} deleted, {d['abandoned']} left to expire, {d['failures']} failed), "
        f"{d['echoed']}/{d['sent']} datagrams echoed"
    )
    low, mean = result["steady_live"]
    print(
        f"soak: live allocations with traffic after the ramp: min {low}, mean {mean:.0f}, "
        f"peak {d['peak_live']} (driver); peak {result['peak_allocations']} held by the server "
        "(abandoned ones included until they expire)"
    )
    rss = [round(x["rss_kb"] / 1024, 1) for x in result["samples"]]
    print(f"soak: RSS MiB every {REPORT_EVERY_S:.0f} s: {rss}")
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
