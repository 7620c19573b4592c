"""Hot handoff: a second stunnerd started with a running one's handoff socket takes over its
TURN-UDP sockets and allocations; the clients relaying through it carry on, and the old process
exits. A successor that cannot read the state is refused and the old one serves on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stunnerd.handoff.transport.channel import HandoffRefusedError, take_over
from support.echo import UdpEcho, udp_echo
from support.stunnerd_process import ManagedStunnerd, base_config, health_port, listener_ports
from support.turn_flows import STEP_TIMEOUT_S, Flow, open_flows, send_steadily

pytestmark = pytest.mark.integration

FLOWS = 20
SEND_INTERVAL_S = 0.05


@pytest.fixture
async def echo() -> AsyncIterator[UdpEcho]:
    """The echo peer, with room for the burst a paused relay sends at once."""
    async with udp_echo(receive_buffer_bytes=4 << 20) as peer:
        yield peer


def stunnerd(
    tmp: Path, name: str, ports: dict[str, int], handoff: Path, workers: int = 0
) -> ManagedStunnerd:
    """A stunnerd on the shared listener ports, with its own health port."""
    home = tmp / name
    home.mkdir()
    config = base_config(health_port(), ports)
    args = ["--handoff-socket", str(handoff), "--udp-thread-num", str(workers)]
    return ManagedStunnerd(home, config, *args, health=health_port())


@pytest.mark.parametrize("workers", [0, 4], ids=["one-process", "4-workers"])
async def test_a_successor_takes_over_every_allocation_and_no_client_notices(
    tmp_path: Path, echo: UdpEcho, workers: int
) -> None:
    ports = listener_ports("a")
    handoff = tmp_path / "handoff" / "stunnerd.sock"
    old = stunnerd(tmp_path, "old", ports, handoff, workers)
    new: ManagedStunnerd | None = None
    flows: list[Flow] = []
    try:
        await old.ready()
        flows = await open_flows(FLOWS, ports["a"])
        await asyncio.gather(*(flow.bind(echo.addr) for flow in flows))
        stop = asyncio.Event()
        sender = asyncio.create_task(send_steadily(flows, echo.addr, stop, SEND_INTERVAL_S))
        try:
            await asyncio.sleep(0.5)
            started = time.monotonic()
            new = stunnerd(tmp_path, "new", ports, handoff, workers)
            code = await asyncio.to_thread(old.proc.proc.wait, STEP_TIMEOUT_S)
            gone = time.monotonic()
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await sender
        await asyncio.sleep(1.0)
        assert code == 0
        assert "handoff: the new process serves" in old.log()
        assert "handoff: exiting" in old.log()
        lost = sum(len(flow.lost()) for flow in flows)
        gap = max(flow.receiver.longest_gap(started) for flow in flows)
        sent = sum(1 for f in flows for t in f.sent.values() if started <= t <= gone)
        print(
            f"handoff ({workers} workers): old exited {gone - started:.2f} s after the new one "
            f"started; lost {lost} of {sent} datagrams sent meanwhile; longest gap {gap:.2f} s"
        )
        assert lost <= sent
        codes = await asyncio.gather(*(flow.refresh() for flow in flows))
        assert codes == [0] * FLOWS
        status = await new.wait_status(
            lambda s: s["allocationCount"] == FLOWS, "every allocation in the new process"
        )
        assert status["status"] == "READY"
        # A new permission and channel on each adopted allocation, to another peer.
        async with udp_echo() as second:
            for flow in flows:
                flow.receiver.first.clear()
                flow.receiver.seen.pop(0, None)
            await asyncio.gather(*(flow.bind(second.addr) for flow in flows))
        assert "Allocation Mismatch" not in new.log()
        assert handoff.exists(), "the new process listens for its own successor"
    finally:
        for flow in flows:
            flow.abandon()
        if new is not None:
            await new.close()
        await old.close()


@contextlib.asynccontextmanager
async def old_serving(
    tmp_path: Path, echo: UdpEcho
) -> AsyncIterator[tuple[ManagedStunnerd, dict[str, int], Path, list[Flow]]]:
    """A stunnerd with a handoff socket and four clients relaying through it; on leaving, a
    refused successor must have left it serving them all (refresh, bind again, status)."""
    ports = listener_ports("a")
    handoff = tmp_path / "handoff" / "stunnerd.sock"
    old = stunnerd(tmp_path, "old", ports, handoff)
    flows: list[Flow] = []
    try:
        await old.ready()
        flows = await open_flows(4, ports["a"])
        await asyncio.gather(*(flow.bind(echo.addr) for flow in flows))
        yield old, ports, handoff, flows
        assert old.proc.alive()
        assert await asyncio.gather(*(flow.refresh() for flow in flows)) == [0] * len(flows)
        for flow in flows:
            flow.receiver.first.clear()
            flow.receiver.seen.pop(0, None)
        await asyncio.gather(*(flow.bind(echo.addr) for flow in flows))
        assert (await old.status())["allocationCount"] == len(flows)
    finally:
        for flow in flows:
            flow.abandon()
        await old.close()


async def test_a_successor_that_cannot_read_the_state_is_refused_and_nothing_is_lost(
    tmp_path: Path, echo: UdpEcho
) -> None:
    async with old_serving(tmp_path, echo) as (_old, _ports, handoff, _flows):
        with pytest.raises(HandoffRefusedError, match="state version 1"):
            await asyncio.to_thread(take_over, handoff, [99])


async def test_a_successor_with_another_worker_count_is_refused_and_the_old_one_serves_on(
    tmp_path: Path, echo: UdpEcho
) -> None:
    async with old_serving(tmp_path, echo) as (_old, ports, handoff, _flows):
        new = stunnerd(tmp_path, "new", ports, handoff, workers=2)
        code = await asyncio.to_thread(new.proc.proc.wait, STEP_TIMEOUT_S)
        assert code == 1
        assert "start it with the same --udp-thread-num" in new.log()
