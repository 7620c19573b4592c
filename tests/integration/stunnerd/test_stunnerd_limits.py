"""An attacker at 10x a limit beside 20 honest clients, against a real stunnerd process.

Over real sockets on loopback: the attacker (127.0.0.2) is refused with the documented code,
every honest client (aioice, from 127.0.0.1) still relays through its allocation, and the
server's resident memory and file descriptors (from /proc) stay flat within a stated margin.
The limits are set small through their `STUNNERD_*` variables so that 10x stays quick.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aioice import stun

from stunnerd.turn.auth import THROTTLED_REASON
from support.echo import echo_peer
from support.ports import free_port, free_udp_tcp_port
from support.stunnerd_process import PASSWORD, REALM, USER, EchoAllocation, ManagedStunnerd

pytestmark = pytest.mark.integration

ATTACKER = "127.0.0.2"
HONEST = 20
AUTH_FAILURE_BURST = 10
MAX_PERMISSIONS = 8
MAX_CHANNELS = 8
RSS_MARGIN_BYTES = 8 * 1024 * 1024
"""What an attack may add to stunnerd's resident memory (allocator noise and caches included)."""
FD_MARGIN = 2
STEP_S = 5.0


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Replies(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.queue.put_nowait(data)


class RawTurn:
    """A bare long-term-credential TURN client over UDP that shows every answer it gets."""

    def __init__(self, transport: asyncio.DatagramTransport, replies: Replies) -> None:
        self.transport = transport
        self.replies = replies
        self.nonce: bytes | None = None
        self.realm = REALM

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, port: int, source: str = ATTACKER) -> AsyncIterator[RawTurn]:
        loop = asyncio.get_running_loop()
        transport, replies = await loop.create_datagram_endpoint(
            Replies, local_addr=(source, 0), remote_addr=("127.0.0.1", port)
        )
        try:
            yield cls(transport, replies)
        finally:
            transport.close()

    async def request(
        self, method: stun.Method, attrs: dict[str, Any], password: str = PASSWORD
    ) -> stun.Message:
        """One request, signed once a nonce is known; a 401/438 challenge is answered once."""
        for _ in range(2):
            msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))
            if self.nonce is not None:
                msg.attributes.update({"USERNAME": USER, "REALM": self.realm, "NONCE": self.nonce})
                key = hashlib.md5(f"{USER}:{self.realm}:{password}".encode()).digest()
                msg.add_message_integrity(key)
            self.transport.sendto(bytes(msg))
            async with asyncio.timeout(STEP_S):
                while True:
                    reply = stun.parse_message(await self.replies.queue.get())
                    if reply.transaction_id == msg.transaction_id:
                        break
            code = reply.attributes.get("ERROR-CODE", (0, ""))[0]
            fresh = self.nonce is None and code == 401
            if not (fresh or code == 438):
                return reply
            self.nonce, self.realm = reply.attributes["NONCE"], reply.attributes["REALM"]
        return reply


def config(port: int, health: int) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {
            "name": "default/gw",
            "loglevel": "all:INFO",
            "healthcheck_endpoint": f"http://127.0.0.1:{health}",
        },
        "auth": {"type": "static", "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [
            {
                "name": "default/gw/udp",
                "protocol": "TURN-UDP",
                "address": "127.0.0.1",
                "port": port,
                "routes": ["loopback"],
            }
        ],
        "clusters": [{"name": "loopback", "type": "STATIC", "endpoints": ["127.0.0.0/8"]}],
    }


@pytest.fixture
async def stunnerd(tmp_path: Path) -> AsyncIterator[tuple[ManagedStunnerd, int]]:
    port = free_udp_tcp_port()
    env = {
        "STUNNERD_AUTH_FAILURE_BURST": str(AUTH_FAILURE_BURST),
        "STUNNERD_AUTH_FAILURE_RATE_PER_S": "0.01",
        "STUNNERD_MAX_PERMISSIONS_PER_ALLOCATION": str(MAX_PERMISSIONS),
        "STUNNERD_MAX_CHANNELS_PER_ALLOCATION": str(MAX_CHANNELS),
    }
    server = ManagedStunnerd(tmp_path, config(port, free_port()), env=env)
    try:
        await server.ready()
        yield server, port
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def honest_clients(port: int) -> AsyncIterator[list[EchoAllocation]]:
    async with echo_peer() as (_, peer):
        clients = [await EchoAllocation.open(port, peer) for _ in range(HONEST)]
        try:
            assert all([await c.echoes() for c in clients])
            yield clients
        finally:
            for c in clients:
                await c.close()


async def flat_while(server: ManagedStunnerd, port: int, attack: Any) -> None:
    """Run `attack` beside the honest clients; none of them loses its relay, RSS and fds stay."""
    pid = server.proc.pid
    async with honest_clients(port) as clients:
        rss, fds = rss_bytes(pid), fd_count(pid)
        await attack()
        assert [await c.echoes() for c in clients] == [True] * HONEST
        assert rss_bytes(pid) - rss < RSS_MARGIN_BYTES
        assert abs(fd_count(pid) - fds) <= FD_MARGIN


async def test_a_password_guesser_gets_verdicts_only_within_its_budget(
    stunnerd: tuple[ManagedStunnerd, int],
) -> None:
    server, port = stunnerd

    async def attack() -> None:
        async with RawTurn.open(port) as guesser:
            answers = [
                (
                    await guesser.request(
                        stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}, "guess"
                    )
                ).attributes["ERROR-CODE"]
                for _ in range(10 * AUTH_FAILURE_BURST)
            ]
        assert {code for code, _ in answers} == {401}
        throttled = sum(reason == THROTTLED_REASON for _, reason in answers)
        assert throttled == 9 * AUTH_FAILURE_BURST
        # the right password from the guesser's address is not checked either, for now
        async with RawTurn.open(port) as again:
            reply = await again.request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
        assert reply.attributes["ERROR-CODE"] == (401, THROTTLED_REASON)

    await flat_while(server, port, attack)
    # one log line for the source in the minute, however many refusals
    assert server.proc.output().count(f"refused ALLOCATE from {ATTACKER}:") == 1


async def test_permissions_and_channels_past_their_caps_get_508(
    stunnerd: tuple[ManagedStunnerd, int],
) -> None:
    server, port = stunnerd

    async def attack() -> None:
        async with RawTurn.open(port) as owner:
            reply = await owner.request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
            assert reply.message_class == stun.Class.RESPONSE
            permits = [
                (
                    await owner.request(
                        stun.Method.CREATE_PERMISSION,
                        {"XOR-PEER-ADDRESS": (f"127.9.{i // 250}.{i % 250 + 1}", 9)},
                    )
                ).attributes.get("ERROR-CODE", (0, ""))[0]
                for i in range(10 * MAX_PERMISSIONS)
            ]
            assert permits == [0] * MAX_PERMISSIONS + [508] * (9 * MAX_PERMISSIONS)
            channels = [
                (
                    await owner.request(
                        stun.Method.CHANNEL_BIND,
                        {"XOR-PEER-ADDRESS": ("127.9.0.1", 7000 + i), "CHANNEL-NUMBER": 0x4000 + i},
                    )
                ).attributes.get("ERROR-CODE", (0, ""))[0]
                for i in range(10 * MAX_CHANNELS)
            ]
            assert channels == [0] * MAX_CHANNELS + [508] * (9 * MAX_CHANNELS)

    await flat_while(server, port, attack)
