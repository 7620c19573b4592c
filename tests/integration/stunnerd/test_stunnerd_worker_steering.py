"""`--udp-thread-num N`: a client's packets reach the worker that holds its allocation, whatever
workers start, die or restart, and stopping drains every worker.

The supervisor holds every worker's SO_REUSEPORT socket, so the kernel's choice of socket for a
client never changes; a worker that dies is replaced by one that adopts the allocations it
journaled to the supervisor, relay sockets included, so its clients carry on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aioice import stun

from support.echo import UdpEcho, udp_echo
from support.stunnerd_process import (
    EchoAllocation,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)
from support.turn_flows import STEP_TIMEOUT_S, Flow, first_answer, open_flows, send_steadily

pytestmark = pytest.mark.integration

SEND_INTERVAL_S = 0.05
FLOWS = 40
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


def four_workers(tmp_path: Path) -> tuple[ManagedStunnerd, int]:
    """stunnerd with 4 workers on one TURN-UDP listener, starting; and the listener's port."""
    ports = listener_ports("a")
    config = base_config(health_port(), ports)
    return ManagedStunnerd(tmp_path, config, "--udp-thread-num", "4"), ports["a"]


async def kill_and_wait_back(server: ManagedStunnerd, victim: dict[str, Any]) -> None:
    """kill -9 of the worker `victim` (its /status entry), then wait until its replacement
    serves the listener."""
    os.kill(victim["pid"], signal.SIGKILL)
    index = victim["index"]
    await server.wait_status(
        lambda s: (
            s["workers"][index]["pid"] not in (None, victim["pid"])
            and all(w["listeners"] == 1 for w in s["workers"])
        ),
        "the killed worker to come back with the listener",
    )


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


async def test_a_killed_worker_s_clients_carry_on_on_its_replacement(
    tmp_path: Path, echo: UdpEcho
) -> None:
    """kill -9 of one of 4 workers: its allocations are adopted by its replacement (journaled
    state, relay sockets held by the supervisor), so no client is disturbed: nothing is lost
    beyond what was sent while no worker ran, no 437, and the adopted allocations take new
    requests (Refresh, a permission and a channel to another peer)."""
    server, port = four_workers(tmp_path)
    flows: list[Flow] = []
    peer = (echo.host, echo.port)
    try:
        await server.ready()
        flows = await open_flows(FLOWS, port)
        await asyncio.gather(*(flow.bind(peer) for flow in flows))
        status = await server.wait_status(
            lambda s: s["allocationCount"] == len(flows), "every allocation counted"
        )
        victim = status["workers"][1]
        assert victim["allocations"] > 0, status["workers"]
        assert [w["journaled"] for w in status["workers"]] == [
            w["allocations"] for w in status["workers"]
        ]
        others = {w["index"]: w["pid"] for w in status["workers"] if w is not victim}

        stop = asyncio.Event()
        sender = asyncio.create_task(send_steadily(flows, peer, stop, SEND_INTERVAL_S))
        try:
            await asyncio.sleep(1.0)
            killed_at = time.monotonic()
            await kill_and_wait_back(server, victim)
            back_at = time.monotonic()
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await sender
        await asyncio.sleep(STRAGGLERS_S)

        window = [
            seq for flow in flows for seq, t in flow.sent.items() if killed_at <= t <= back_at
        ]
        lost = sum(len(flow.lost()) for flow in flows)
        gap = max(flow.receiver.longest_gap(killed_at - 1.0) for flow in flows)
        print(
            f"restart window {back_at - killed_at:.2f} s; lost {lost} of {len(window)} datagrams "
            f"sent in it (all flows); longest gap of a flow {gap:.2f} s"
        )
        assert lost <= len(window), (lost, len(window))
        assert gap <= back_at - killed_at + 1.0
        codes = await asyncio.gather(*(flow.refresh() for flow in flows))
        assert codes == [0] * len(flows)
        status = await server.wait_status(
            lambda s: s["allocationCount"] == len(flows), "every allocation still counted"
        )
        assert status["workers"][1]["allocations"] == victim["allocations"]
        assert {w["index"]: w["pid"] for w in status["workers"] if w["index"] != 1} == others
        assert f"adopting {victim['allocations']} journaled allocation(s)" in server.log()

        # A new permission and channel on every allocation, to a second peer, after the restart.
        async with udp_echo() as second:
            for flow in flows:
                flow.receiver.first.clear()
                flow.receiver.seen.pop(0, None)
            await asyncio.gather(*(flow.bind(second.addr) for flow in flows))
        assert "Allocation Mismatch" not in server.log()
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


async def test_without_the_journal_a_killed_worker_s_allocations_end_and_no_other(
    tmp_path: Path, echo: UdpEcho
) -> None:
    """STUNNERD_WORKER_JOURNAL=false: nothing is journaled, so the allocations of a worker
    killed with -9 end with it (their clients get 437 and may allocate again) while every other
    worker's clients carry on."""
    ports = listener_ports("a")
    config = base_config(health_port(), ports)
    server = ManagedStunnerd(
        tmp_path, config, "--udp-thread-num", "4", env={"STUNNERD_WORKER_JOURNAL": "false"}
    )
    flows: list[Flow] = []
    try:
        await server.ready()
        flows = await open_flows(FLOWS, ports["a"])
        await asyncio.gather(*(flow.bind((echo.host, echo.port)) for flow in flows))
        status = await server.wait_status(
            lambda s: s["allocationCount"] == len(flows), "every allocation counted"
        )
        assert [w["journaled"] for w in status["workers"]] == [0, 0, 0, 0]
        victim = status["workers"][1]
        assert victim["allocations"] > 0, status["workers"]
        await kill_and_wait_back(server, victim)
        codes = await asyncio.gather(*(flow.refresh() for flow in flows))
        assert (
            sorted(codes)
            == [0] * (len(flows) - victim["allocations"]) + [437] * victim["allocations"]
        )
        assert f"adopting {victim['allocations']} journaled allocation(s)" not in server.log()
    finally:
        for flow in flows:
            flow.abandon()
        await server.close()
