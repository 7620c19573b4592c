"""aioice TURN clients relaying numbered datagrams through a stunnerd, one allocation each.

Each `Flow` sends `index:seq` datagrams to an echo peer through its allocation (ChannelData once
its channel is bound) and records which sequence numbers came back and when, so a test can count
losses and the longest silence of a flow across a worker restart or a handoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from typing import Any

from aioice import stun
from aioice.turn import TurnTransport, create_turn_endpoint

from support.stunnerd_process import PASSWORD, USER

STEP_TIMEOUT_S = 30.0


class CountingReceiver(asyncio.DatagramProtocol):
    """Records the sequence numbers that come back through one allocation, and when."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.first = asyncio.Event()  # sequence number 0 came back
        self.other = 0

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            seq = int(data.split(b":")[1])
        except (IndexError, ValueError):
            self.other += 1
            return
        self.seen[seq] = time.monotonic()
        if seq == 0:
            self.first.set()

    def longest_gap(self, since: float) -> float:
        """The longest time between two datagrams coming back after `since`."""
        times = sorted(t for t in self.seen.values() if t >= since)
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


class Flow:
    """One allocation sending numbered datagrams to the echo peer."""

    def __init__(self, index: int, transport: TurnTransport, receiver: CountingReceiver) -> None:
        self.index = index
        self.transport = transport
        self.receiver = receiver
        self.sent: dict[int, float] = {}
        self.inner: Any = transport._TurnTransport__inner_protocol  # type: ignore[attr-defined]

    @classmethod
    async def open(cls, index: int, port: int) -> Flow:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            transport, receiver = await create_turn_endpoint(
                CountingReceiver, server_addr=("127.0.0.1", port), username=USER, password=PASSWORD
            )
        return cls(index, transport, receiver)

    def send(self, peer: tuple[str, int], seq: int) -> None:
        self.sent[seq] = time.monotonic()
        self.transport.sendto(b"%d:%d" % (self.index, seq), peer)

    def lost(self) -> list[int]:
        return [seq for seq in self.sent if seq not in self.receiver.seen]

    async def bind(self, peer: tuple[str, int]) -> None:
        """Bind the channel (aioice does it on the first send) and see one datagram come back."""
        async with asyncio.timeout(STEP_TIMEOUT_S):
            await self.inner.send_data(b"%d:0" % self.index, peer)
            await self.receiver.first.wait()

    async def refresh(self) -> int:
        """Refresh the allocation; 0 when it succeeds, else the error code."""
        request = stun.Message(message_method=stun.Method.REFRESH, message_class=stun.Class.REQUEST)
        request.attributes["LIFETIME"] = 600
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S):
                await self.inner.request_with_retry(request)
        except stun.TransactionFailed as exc:
            return int(exc.response.attributes["ERROR-CODE"][0])
        return 0

    def abandon(self) -> None:
        if self.inner.refresh_task is not None:
            self.inner.refresh_task.cancel()
        if self.inner.transport is not None:
            self.inner.transport.close()


async def open_flows(count: int, port: int, batch: int = 20) -> list[Flow]:
    flows: list[Flow] = []
    for start in range(0, count, batch):
        flows += await asyncio.gather(
            *(Flow.open(i, port) for i in range(start, min(count, start + batch)))
        )
    return flows


async def send_steadily(
    flows: list[Flow], peer: tuple[str, int], stop: asyncio.Event, interval_s: float
) -> None:
    """Every flow sends one numbered datagram each `interval_s` until `stop` is set."""
    seq = 0
    while not stop.is_set():
        seq += 1
        for flow in flows:
            flow.send(peer, seq)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await stop.wait()


async def first_answer(port: int) -> None:
    """Send STUN Binding requests until the listener answers one (some worker is serving)."""
    request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(STEP_TIMEOUT_S):
            while True:
                with contextlib.suppress(ConnectionRefusedError):
                    sock.sendto(bytes(request), ("127.0.0.1", port))
                try:
                    async with asyncio.timeout(0.05):
                        await loop.sock_recv(sock, 2048)
                    return
                except (TimeoutError, ConnectionRefusedError):
                    continue
