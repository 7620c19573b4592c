"""coturn's turnutils_uclient relays through a 4-worker stunnerd while one worker is killed:
the worker's replacement adopts its allocations, so the client loses nothing beyond what its
socket queues could not hold while no worker ran."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import pytest

from support.processes import which
from support.stunnerd_process import (
    PASSWORD,
    USER,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

SESSIONS = 8
MESSAGES = 400
INTERVAL_MS = 10


async def test_uclient_sessions_carry_on_across_a_killed_worker(
    tmp_path: Path, udp_echo_peer: int
) -> None:
    binary = which("turnutils_uclient")
    if binary is None:
        pytest.skip("turnutils_uclient (coturn) is not installed")
    ports = listener_ports("a")
    config = base_config(health_port(), ports)
    server = ManagedStunnerd(tmp_path, config, "--udp-thread-num", "4")
    try:
        await server.ready()
        args = [
            "-p", str(ports["a"]), "-u", USER, "-w", PASSWORD, "-e", "127.0.0.1",
            "-r", str(udp_echo_peer), "-c", "-X", "-m", str(SESSIONS), "-n", str(MESSAGES),
            "-z", str(INTERVAL_MS), "-l", "100", "127.0.0.1",
        ]  # fmt: skip
        client = await asyncio.create_subprocess_exec(
            binary, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            status = await server.wait_status(
                lambda s: s["allocationCount"] == SESSIONS * 2, "the sessions' allocations"
            )
            await asyncio.sleep(1.0)
            victim = max(status["workers"], key=lambda w: w["allocations"])
            killed = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)
            await server.wait_status(
                lambda s: (
                    s["workers"][victim["index"]]["pid"] not in (None, victim["pid"])
                    and all(w["listeners"] == 1 for w in s["workers"])
                ),
                "the killed worker to come back",
            )
            window = time.monotonic() - killed
            async with asyncio.timeout(90):
                output = (await client.communicate())[0].decode(errors="replace")
        finally:
            if client.returncode is None:
                client.kill()
                await client.wait()
        totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$", output, re.M)
        assert totals, output[-3000:]
        sent, received = map(int, totals[-1])
        # At most each allocation of the victim's one message per interval while no worker ran.
        in_window = victim["allocations"] * window * 1000 / INTERVAL_MS
        print(
            f"uclient: worker {victim['index']} held {victim['allocations']} of "
            f"{SESSIONS * 2} allocations; window {window:.2f} s; sent {sent}, received {received}"
        )
        assert sent == SESSIONS * MESSAGES, output[-3000:]
        assert sent - received <= in_window, output[-3000:]
        assert "Allocation Mismatch" not in server.log()
        assert f"adopting {victim['allocations']} journaled allocation(s)" in server.log()
    finally:
        await server.close()
