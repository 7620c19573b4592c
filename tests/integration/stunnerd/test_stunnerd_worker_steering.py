"""`--udp-thread-num N`: a client's packets reach the worker that holds its allocation, whatever
workers start, die or restart, and stopping drains every worker.

The supervisor holds every worker's SO_REUSEPORT socket, so the kernel's choice of socket for a
client never changes; a worker that dies takes only its own allocations with it, and their
clients get 437 (Allocation Mismatch) on their next request to its replacement.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aioice import stun
from aioice.turn import TurnTransport, create_turn_endpoint

from support.echo import UdpEcho, udp_echo
from support.stunnerd_process import (
    PASSWORD,
    USER,
    EchoAllocation,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = pytest.mark.integration

STEP_TIMEOUT_S = 30.0
SEND_INTERVAL_S = 0.2
STRAGGLERS_S = 2.0


ECHO_BUFFER_BYTES = 4 * 1024 * 1024


@pytest.fixture
async def echo() -> AsyncIterator[UdpEcho]:
    """The echo peer, with a receive buffer that rides out this process being descheduled."""
    async with udp_echo() as peer:
        assert peer.protocol.transport is not None
        sock = peer.protocol.transport.get_extra_info("socket")
        for opt in (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, ECHO_BUFFER_BYTES)
                break
            except OSError:
                continue
        yield peer


class CountingReceiver(asyncio.DatagramProtocol):
    """Records the sequence numbers that come back through one allocation."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.first = asyncio.Event()  # sequence number 0 came back
        self.other = 0

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            seq = int(data.split(b":")[1])
        except (IndexError, ValueError):
            self.other += 1
            return
        self.seen.add(seq)
        if seq == 0:
            self.first.set()


class Flow:
    """One allocation sending numbered datagrams to the echo peer."""

    def __init__(self, index: int, transport: TurnTransport, receiver: CountingReceiver) -> None:
        self.index = index
        self.transport = transport
        self.receiver = receiver
        self.sent: list[int] = []
        self.inner: Any = transport._TurnTransport__inner_protocol  # type: ignore[attr-defined]

    @classmethod
    async def open(cls, index: int, port: int) -> Flow:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            transport, receiver = await create_turn_endpoint(
                CountingReceiver, server_addr=("127.0.0.1", port), username=USER, password=PASSWORD
            )
        return cls(index, transport, receiver)

    def send(self, peer: tuple[str, int], seq: int) -> None:
        self.sent.append(seq)
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


def four_workers(tmp_path: Path) -> tuple[ManagedStunnerd, int]:
    """stunnerd with 4 workers on one TURN-UDP listener, starting; and the listener's port."""
    ports = listener_ports("a")
    config = base_config(health_port(), ports)
    return ManagedStunnerd(tmp_path, config, "--udp-thread-num", "4"), ports["a"]


async def test_clients_that_start_while_workers_come_up_all_succeed(
    tmp_path: Path, echo: UdpEcho
) -> None:
    server, port = four_workers(tmp_path)
    flows: list[Flow] = []
    peer = (echo.host, echo.port)
    try:
        await first_answer(port)
        flows = await open_flows(40, port, batch=40)
        status = await server.ready()
        assert sum(1 for w in status["workers"] if w["pid"]) == 4
        # Every later request of each client must reach the worker that made its allocation:
        # a moved flow would get 438 (another worker's nonce) or 437 (no allocation there).
        await asyncio.gather(*(flow.bind(peer) for flow in flows))
        codes = await asyncio.gather(*(flow.refresh() for flow in flows))
        assert codes == [0] * len(flows)
        await server.wait_status(
            lambda s: s["allocationCount"] == len(flows), "every allocation counted"
        )
        assert "Stale Nonce" not in server.log()
    finally:
        for flow in flows:
            flow.abandon()
        await server.close()


async def test_a_killed_worker_loses_only_its_own_flows_and_its_clients_get_437(
    tmp_path: Path, echo: UdpEcho
) -> None:
    server, port = four_workers(tmp_path)
    flows: list[Flow] = []
    peer = (echo.host, echo.port)
    try:
        await server.ready()
        flows = await open_flows(200, port)
        for start in range(0, len(flows), 40):
            await asyncio.gather(*(flow.bind(peer) for flow in flows[start : start + 40]))
        status = await server.wait_status(
            lambda s: s["allocationCount"] == len(flows), "every allocation counted"
        )
        victim = status["workers"][1]
        assert victim["allocations"] > 0, status["workers"]
        others = {w["index"]: w["pid"] for w in status["workers"] if w is not victim}

        stop = asyncio.Event()

        async def send_steadily() -> None:
            seq = 0
            while not stop.is_set():
                seq += 1
                for flow in flows:
                    flow.send(peer, seq)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SEND_INTERVAL_S):
                        await stop.wait()

        sender = asyncio.create_task(send_steadily())
        try:
            await asyncio.sleep(1.0)
            os.kill(victim["pid"], signal.SIGKILL)
            await server.wait_status(
                lambda s: (
                    s["workers"][1]["pid"] not in (None, victim["pid"])
                    and all(w["listeners"] == 1 for w in s["workers"])
                ),
                "the killed worker to come back with the listener",
            )
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await sender
        await asyncio.sleep(STRAGGLERS_S)

        lossy = [flow for flow in flows if flow.lost()]
        assert len(lossy) == victim["allocations"], (
            f"{len(lossy)} flows lost datagrams; the killed worker held {victim['allocations']}"
        )
        codes = await asyncio.gather(*(flow.refresh() for flow in flows))
        assert sorted(codes[f.index] for f in lossy) == [437] * len(lossy)
        assert all(codes[f.index] == 0 for f in flows if f not in lossy)
        status = await server.wait_status(
            lambda s: s["allocationCount"] == len(flows) - len(lossy),
            "the lost allocations to be gone from the count",
        )
        assert {w["index"]: w["pid"] for w in status["workers"] if w["index"] != 1} == others

        # The client of a lost allocation starts over on the same 5-tuple, on the new worker.
        again = lossy[0]
        again.inner.peer_to_channel.clear()
        again.inner.channel_to_peer.clear()
        again.receiver.seen.clear()
        again.receiver.first.clear()
        async with asyncio.timeout(STEP_TIMEOUT_S):
            await again.inner.connect()
        await again.bind(peer)
    finally:
        for flow in flows:
            flow.abandon()
        await server.close()


async def test_sigterm_drains_every_worker(tmp_path: Path, echo: UdpEcho) -> None:
    ports = listener_ports("a")
    server = ManagedStunnerd(
        tmp_path,
        base_config(health_port(), ports),
        "--udp-thread-num",
        "3",
        "--grace-period",
        "60",
    )
    allocations: list[EchoAllocation] = []
    peer = (echo.host, echo.port)
    try:
        status = await server.ready()
        pids = [w["pid"] for w in status["workers"]]
        for _ in range(60):
            allocations.append(await EchoAllocation.open(ports["a"], peer))
            status = await server.status()
            if all(w["allocations"] > 0 for w in status["workers"]):
                break
        assert all(w["allocations"] > 0 for w in status["workers"]), status["workers"]

        server.proc.proc.send_signal(signal.SIGTERM)
        await server.wait_status(lambda s: s["status"] == "TERMINATING", "TERMINATING")
        assert (await server.get("/ready")).status_code == 503
        for alloc in allocations:
            assert await alloc.echoes(), "a live allocation keeps relaying while draining"
        # Fresh clients hash over all three workers: each one refuses.
        for _ in range(12):
            with pytest.raises(stun.TransactionFailed) as refused:
                await EchoAllocation.open(ports["a"], peer)
            assert refused.value.response.attributes["ERROR-CODE"][0] == 486
        assert server.proc.alive()
        for alloc in allocations[:-1]:
            await alloc.close()
        assert server.proc.alive(), "stunnerd left before the last allocation ended"
        await allocations[-1].close()
        code = await asyncio.to_thread(server.proc.proc.wait, STEP_TIMEOUT_S)
        assert code == 0
        assert "drained: no allocations left" in server.log()
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        await server.close()
