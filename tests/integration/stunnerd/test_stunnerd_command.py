"""The `stunnerd` command: clear errors and exit 1 for bad input, a working relay from a URI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aioice import stun
from fixtures.stunnerd.client import UdpTurnClient

from support.echo import echo_peer
from support.ports import free_udp_tcp_port
from support.processes import ServerProcess
from support.stunnerd_process import PASSWORD, USER, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STUNNERD = str(Path(sys.executable).with_name("stunnerd"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read config file"),
        ("version: v1\nauth: {credentials: {username: u}}\n", "empty username or password"),
        (
            "version: v1\nauth: {credentials: {username: u, password: p}}\n"
            "listeners: [{name: l, protocol: TURN-QUIC}]\n",
            'unknown listener protocol: "TURN-QUIC"',
        ),
        ("version: v9\n", "unsupported API version"),
        ("{not yaml: [", "config"),
    ],
)
def test_a_bad_config_exits_1_with_a_message_naming_the_problem(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "stunnerd.yaml"
    if content is not None:
        path.write_text(content)
    done = subprocess.run(
        [STUNNERD, "-c", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 1
    assert message in done.stderr


def test_a_turn_uri_without_credentials_is_refused() -> None:
    done = subprocess.run(
        [STUNNERD, "turn://user@127.0.0.1:3478?transport=udp"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "username/password" in done.stderr


async def relay_round_trip(port: int) -> None:
    async with echo_peer() as (_peer, peer_addr), UdpTurnClient(("127.0.0.1", port)) as client:
        reply = await client.allocate()
        assert reply.message_class == stun.Class.RESPONSE
        bound = await client.request(
            stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer_addr}
        )
        assert bound.message_class == stun.Class.RESPONSE
        client.send_raw(b"\x40\x00\x00\x04ping")
        assert await client.recv_raw() == b"\x40\x00\x00\x04ping"


def test_a_turn_uri_starts_a_relay_that_admits_any_peer(tmp_path: Path) -> None:
    port = free_udp_tcp_port()
    uri = f"turn://{USER}:{PASSWORD}@127.0.0.1:{port}?transport=udp"
    proc = ServerProcess(
        [STUNNERD, uri, "--bind", "127.0.0.1", "--grace-period", "0"],
        env={**os.environ, "STUNNERD_HEALTH_PORT": "0"},  # not the default 8086
        log_path=tmp_path / "stunnerd.log",
    )
    try:
        wait_ready(proc, 1)
        asyncio.run(relay_round_trip(port))
    finally:
        proc.stop()
