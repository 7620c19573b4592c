"""`--udp-thread-num 2`: two worker processes share each listener port and both relay.

The kernel spreads clients over the workers by 5-tuple hash, so the test opens allocations from
fresh client sockets until each worker holds at least one, then checks that every allocation
relays, that a config change reaches both workers, and that /status and /metrics sum them.
"""

from __future__ import annotations

import copy
import os
import signal
from pathlib import Path

import pytest

from support.echo import UdpEcho
from support.stunnerd_process import (
    EchoAllocation,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = pytest.mark.integration

MAX_CLIENTS = 40


async def test_two_workers_share_the_port_relay_and_take_every_config(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("a")
    metrics = health_port()
    config = base_config(health_port(), ports)
    config["admin"]["metrics_endpoint"] = f"http://127.0.0.1:{metrics}/metrics"
    server = ManagedStunnerd(tmp_path, config, "--udp-thread-num", "2")
    allocations: list[EchoAllocation] = []
    try:
        status = await server.ready()
        workers = status["workers"]
        assert len(workers) == 2
        assert len({w["pid"] for w in workers}) == 2
        peer = (echo.host, echo.port)
        for _ in range(MAX_CLIENTS):
            allocations.append(await EchoAllocation.open(ports["a"], peer))
            status = await server.status()
            if all(w["allocations"] > 0 for w in status["workers"]):
                break
        assert all(w["allocations"] > 0 for w in status["workers"]), status["workers"]
        assert status["allocationCount"] == len(allocations)
        for alloc in allocations:
            assert await alloc.echoes()

        cfg = copy.deepcopy(server.config)
        cfg["listeners"][0]["routes"] = ["elsewhere"]
        await server.write(cfg)
        for alloc in allocations:
            assert not await alloc.echoes(wait_s=0.6), "a worker kept the old routes"
        cfg["listeners"][0]["routes"] = ["echo"]
        await server.write(cfg)
        for alloc in allocations:
            assert await alloc.echoes(), "a worker did not take the restored routes"

        scrape = (await server.get("/metrics", metrics)).text
        assert f"stunner_allocations_active {float(len(allocations))}" in scrape
        # Both workers announce each listener; the port is the same.
        assert server.proc.output().count(f"ready on port {ports['a']}") == 1
    finally:
        for alloc in allocations:
            await alloc.close()
        await server.close()


async def test_a_worker_that_dies_is_restarted_with_the_running_config(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("a")
    server = ManagedStunnerd(tmp_path, base_config(health_port(), ports), "--udp-thread-num", "2")
    try:
        status = await server.ready()
        victim = status["workers"][0]["pid"]
        os.kill(victim, signal.SIGKILL)
        status = await server.wait_status(
            lambda s: (
                s["workers"][0]["pid"] not in (None, victim)
                and all(w["listeners"] == 1 for w in s["workers"])
            ),
            "the worker to come back with the listener",
        )
        assert "worker 0 (pid" in server.log()
        alloc = await EchoAllocation.open(ports["a"], (echo.host, echo.port))
        assert await alloc.echoes()
        await alloc.close()
    finally:
        await server.close()


async def test_a_worker_killed_again_and_again_keeps_coming_back(
    tmp_path: Path, echo: UdpEcho
) -> None:
    """Each kill lands at a different point of the supervisor's own reads and writes to the
    worker (a stats request may be in flight); the watchdog must survive every one of them."""
    ports = listener_ports("a")
    server = ManagedStunnerd(tmp_path, base_config(health_port(), ports), "--udp-thread-num", "2")
    try:
        status = await server.ready()
        for _ in range(4):
            victim = status["workers"][0]["pid"]
            os.kill(victim, signal.SIGKILL)
            status = await server.wait_status(
                lambda s, gone=victim: (
                    s["workers"][0]["pid"] not in (None, gone)
                    and all(w["listeners"] == 1 for w in s["workers"])
                ),
                "the worker to come back with the listener",
            )
        alloc = await EchoAllocation.open(ports["a"], (echo.host, echo.port))
        assert await alloc.echoes()
        await alloc.close()
    finally:
        await server.close()
