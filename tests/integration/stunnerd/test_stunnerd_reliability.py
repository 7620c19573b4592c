"""Reconfiguring under load loses nothing on the allocations the change does not concern.

A steady, paced stream runs through one allocation while the config is changed over and over:
another listener's routes, the credentials, a third listener added and removed, the log level.
Every datagram sent on the steady allocation must come back.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

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

PACKETS = 1500
INTERVAL_S = 0.002
CHANGES = 12


def changes(base: dict[str, Any], extra_port: int) -> list[dict[str, Any]]:
    out = []
    for i in range(CHANGES):
        cfg = copy.deepcopy(base)
        kind = i % 4
        if kind == 0:
            cfg["listeners"][1]["routes"] = ["echo", "elsewhere"] if i % 8 == 0 else ["echo"]
        elif kind == 1:
            cfg["auth"]["credentials"]["password"] = f"rotated-{i}"
        elif kind == 2:
            cfg["listeners"].append(
                {"name": "c", "protocol": "TURN-UDP", "address": "127.0.0.1", "port": extra_port}
            )
        else:
            cfg["admin"]["loglevel"] = "all:DEBUG" if i % 8 == 3 else "all:INFO"
        out.append(cfg)
    return out


async def test_reconfiguring_repeatedly_loses_no_packet_on_an_unaffected_allocation(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("a", "b")
    server = ManagedStunnerd(tmp_path, base_config(health_port(), ports))
    try:
        await server.ready()
        steady = await EchoAllocation.open(ports["a"], (echo.host, echo.port))
        assert await steady.echoes()
        steady.receiver.received = asyncio.Queue()
        base = copy.deepcopy(server.config)

        async def reconfigure() -> int:
            applied = 0
            for cfg in changes(base, listener_ports("c")["c"]):
                await server.write(cfg)
                applied += 1
            return applied

        async def stream() -> None:
            for seq in range(PACKETS):
                steady.transport.sendto(f"seq-{seq}".encode(), steady.peer)
                await asyncio.sleep(INTERVAL_S)

        applied, _ = await asyncio.gather(reconfigure(), stream())
        received: set[bytes] = set()
        async with asyncio.timeout(5):
            while len(received) < PACKETS:
                received.add(await steady.receiver.received.get())
        assert applied == CHANGES
        assert received == {f"seq-{seq}".encode() for seq in range(PACKETS)}
        await steady.close()
    finally:
        await server.close()
