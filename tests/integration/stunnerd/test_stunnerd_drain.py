"""Graceful shutdown of a real stunnerd: SIGTERM while an allocation is relaying."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest
from aioice.stun import TransactionFailed

from support.echo import UdpEcho
from support.stunnerd_process import (
    EchoAllocation,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = pytest.mark.integration


async def start(tmp_path: Path, *args: str) -> tuple[ManagedStunnerd, int]:
    ports = listener_ports("a")
    server = ManagedStunnerd(tmp_path, base_config(health_port(), ports), *args)
    await server.ready()
    return server, ports["a"]


async def exit_code(server: ManagedStunnerd, timeout_s: float = 15.0) -> int:
    return int(await asyncio.to_thread(server.proc.proc.wait, timeout_s))


async def test_sigterm_turns_ready_off_refuses_new_allocations_and_exits_after_the_last_one(
    tmp_path: Path, echo: UdpEcho
) -> None:
    server, port = await start(tmp_path, "--grace-period", "60")
    try:
        alloc = await EchoAllocation.open(port, (echo.host, echo.port))
        assert await alloc.echoes()
        server.proc.proc.send_signal(signal.SIGTERM)
        await server.wait_status(lambda s: s["status"] == "TERMINATING", "TERMINATING")
        assert (await server.get("/ready")).status_code == 503
        assert (await server.get("/live")).status_code == 200
        assert server.proc.alive()
        assert await alloc.echoes(), "a live allocation keeps relaying while draining"
        with pytest.raises(TransactionFailed) as refused:
            await EchoAllocation.open(port, (echo.host, echo.port))
        assert refused.value.response.attributes["ERROR-CODE"][0] == 486
        assert server.proc.alive()
        await alloc.close()
        assert await exit_code(server) == 0
        assert "drained: no allocations left" in server.log()
    finally:
        await server.close()


async def test_the_grace_period_bounds_the_wait_for_allocations(
    tmp_path: Path, echo: UdpEcho
) -> None:
    server, port = await start(tmp_path, "--grace-period", "0.5")
    try:
        alloc = await EchoAllocation.open(port, (echo.host, echo.port))
        assert await alloc.echoes()
        server.proc.proc.send_signal(signal.SIGTERM)
        assert await exit_code(server) == 0
        assert "grace period over with 1 allocation(s) left" in server.log()
        alloc.abandon()
    finally:
        await server.close()


async def test_a_second_signal_ends_the_drain_at_once(tmp_path: Path, echo: UdpEcho) -> None:
    server, port = await start(tmp_path, "--grace-period", "600")
    try:
        alloc = await EchoAllocation.open(port, (echo.host, echo.port))
        server.proc.proc.send_signal(signal.SIGINT)
        await server.wait_status(lambda s: s["status"] == "TERMINATING", "TERMINATING")
        server.proc.proc.send_signal(signal.SIGINT)
        assert await exit_code(server) == 0
        assert "drain aborted with 1 allocation(s) left" in server.log()
        alloc.abandon()
    finally:
        await server.close()


async def test_a_config_file_that_cannot_be_loaded_exits_with_status_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: v1\nauth: {credentials: {username: u, password: p}}\n"
        "listeners: [{name: x, protocol: dummy}]\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "stunnerd",
        "-c",
        str(bad),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(20):
        _, err = await proc.communicate()
    assert proc.returncode == 1
    assert b"invalid config file" in err
    assert b"protocol" in err


async def test_json_log_format_and_the_log_flag_override_the_config(tmp_path: Path) -> None:
    import json

    server, _ = await start(tmp_path, "--log-format", "json", "-l", "all:DEBUG")
    try:
        cfg = dict(server.config)
        cfg["admin"] = {**cfg["admin"], "loglevel": "all:ERROR"}
        await server.write(cfg)
        lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    finally:
        await server.close()
    assert any(entry["logger"] == "stunnerd.reconcile.reconciler" for entry in lines)
    debug = [e for e in lines if e["level"] == "DEBUG" and e["msg"].startswith("config handled")]
    assert len(debug) >= 2, "-l all:DEBUG must win over the config's loglevel all:ERROR"
