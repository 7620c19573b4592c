"""A call through the real node: numbered datagrams at a steady rate through a local turncat,
echoed by the udp-echo pod, counted on return.

``EchoCall`` sends to turncat's local UDP socket every ``interval_s`` and records which
sequence numbers came back and when, so a test can say how many datagrams a fault cost and
how long the longest silence was, while something else (a pod deleted, a rollout) happens.
``wait_turn_answers`` waits for a TURN server's address to answer before turncat dials it.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time
from dataclasses import dataclass, field

from support.ports import LOOPBACK

STUN_BINDING = bytes.fromhex("000100002112a442") + b"node-tier-tx"  # a Binding request


def wait_turn_answers(server: str, timeout_s: float = 30.0) -> None:
    """Until a STUN Binding to `server`'s address is answered. kube-proxy programs a NodePort
    shortly after its pod is Ready (at most a sync later); a datagram sent before that is
    refused, and turncat, whose socket is connected, exits on the ICMP error."""
    host, _, port = server.rpartition("@")[2].rpartition(":")
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # unconnected: no ICMP error
        sock.settimeout(0.5)
        while time.monotonic() < deadline:
            sock.sendto(STUN_BINDING, (host, int(port)))
            try:
                sock.recvfrom(2048)
            except TimeoutError:
                continue
            return
    raise AssertionError(f"no STUN answer from {host}:{port} in {timeout_s:.0f} s")


HEADER = struct.Struct("!4sI")
MAGIC = b"CALL"
SETTLE_S = 0.5
"""How long a datagram may take to come back before a report counts it lost."""


@dataclass(frozen=True, slots=True)
class CallReport:
    sent: int
    received: int
    lost: int
    longest_gap_s: float
    """The longest time between two replies while the call ran."""

    def __str__(self) -> str:
        return (
            f"sent {self.sent}, received {self.received}, lost {self.lost}, "
            f"longest gap {self.longest_gap_s * 1000:.0f} ms"
        )


@dataclass
class EchoCall(asyncio.DatagramProtocol):
    port: int
    interval_s: float = 0.02
    sent: int = 0
    arrivals: dict[int, float] = field(default_factory=dict)
    _transport: asyncio.DatagramTransport | None = None
    _task: asyncio.Task[None] | None = None
    _first_reply: asyncio.Event = field(default_factory=asyncio.Event)
    _started_at: float = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) >= HEADER.size:
            magic, seq = HEADER.unpack_from(data)
            if magic == MAGIC:
                self.arrivals.setdefault(seq, asyncio.get_running_loop().time())
                self._first_reply.set()

    async def start(self, timeout_s: float = 20.0) -> None:
        """Connect to turncat and send until the first reply (the relay works), then go on."""
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, remote_addr=(LOOPBACK, self.port))
        self._task = asyncio.create_task(self._send(), name=f"echo-call-{self.port}")
        async with asyncio.timeout(timeout_s):
            await self._first_reply.wait()
        self.sent, self.arrivals = 0, {}  # count from the first answered datagram on
        self._started_at = loop.time()

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            assert self._transport is not None
            self._transport.sendto(HEADER.pack(MAGIC, self.sent) + bytes(100))
            self.sent += 1
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def report(self) -> CallReport:
        times = sorted(self.arrivals.values())
        gaps = [b - a for a, b in itertools.pairwise(times)]
        received = sum(1 for seq in self.arrivals if seq < self.sent)
        return CallReport(self.sent, received, self.sent - received, max(gaps, default=0.0))

    def mark(self) -> tuple[int, float]:
        """Where the call stands now: (datagrams sent, loop time), for ``report_since``."""
        return self.sent, asyncio.get_running_loop().time()

    def report_since(self, mark: tuple[int, float], until: tuple[int, float]) -> CallReport:
        """Datagrams sent between two marks, and the longest silence in between."""
        first, since = mark
        last, end = until
        received = sum(1 for seq in self.arrivals if first <= seq < last)
        times = sorted(t for t in self.arrivals.values() if since <= t <= end)
        edges = [since, *times, end]
        gaps = [b - a for a, b in itertools.pairwise(edges)]
        return CallReport(last - first, received, last - first - received, max(gaps, default=0.0))

    def whole(self) -> tuple[int, float]:
        """The mark of the call's start (its first answered datagram), for the whole call."""
        return 0, self._started_at

    async def settled(self, mark: tuple[int, float], settle_s: float = SETTLE_S) -> CallReport:
        """``report_since(mark, now)``, read ``settle_s`` later: a datagram sent just before now
        and still on its way back is not counted lost (the call goes on meanwhile)."""
        until = self.mark()
        await asyncio.sleep(settle_s)
        return self.report_since(mark, until)

    async def stop(self, drain_s: float = 1.0) -> CallReport:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.sleep(drain_s)
        if self._transport is not None:
            self._transport.close()
        return self.report()
