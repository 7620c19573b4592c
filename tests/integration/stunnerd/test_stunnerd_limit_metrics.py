"""Each limit's refusals move its own `stunner_listener_limit_refusals_total` series, no other.

A real stunnerd process with the limit under test set small through its `STUNNERD_*` variable;
the attacker (127.0.0.2) of `test_stunnerd_limits` crosses it over real sockets, and the metrics
endpoint must then show exactly that many refusals under that `limit` label and none under any
other. With two worker processes the counts of both add up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aioice import stun
from integration.stunnerd.test_stunnerd_limits import ATTACKER, STEP_S, RawTurn
from prometheus_client.parser import text_string_to_metric_families

from stunnerd.turn.refusals import LIMITS
from support.ports import free_port, free_udp_tcp_port
from support.stunnerd_process import PASSWORD, USER, ManagedStunnerd

pytestmark = pytest.mark.integration

SERIES = "stunner_listener_limit_refusals_total"
UDP = "default/gw/udp"
TCP = "default/gw/tcp"
BINDING = bytes(stun.Message(stun.Method.BINDING, stun.Class.REQUEST))


@dataclass
class Served:
    server: ManagedStunnerd
    udp: int
    tcp: int
    metrics: int

    async def limits(self) -> dict[tuple[str, str], int]:
        """{(listener, limit): count} of every series, zeros included."""
        reply = await self.server.get("/metrics", self.metrics)
        reply.raise_for_status()
        return {
            (s.labels["name"], s.labels["limit"]): int(s.value)
            for family in text_string_to_metric_families(reply.text)
            for s in family.samples
            if s.name == SERIES
        }

    async def moved_to(self, expected: dict[tuple[str, str], int]) -> None:
        """Wait until the non-zero series are exactly `expected`; then every limit of every
        listener is still exposed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STEP_S
        while True:
            found = await self.limits()
            moved = {key: n for key, n in found.items() if n}
            if moved == expected or loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert moved == expected
        assert set(found) == {(name, limit) for name in (UDP, TCP) for limit in LIMITS}


def config(udp: int, tcp: int, health: int, metrics: int, user_quota: int) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {
            "name": "default/gw",
            "loglevel": "all:INFO",
            "healthcheck_endpoint": f"http://127.0.0.1:{health}",
            "metrics_endpoint": f"http://127.0.0.1:{metrics}/metrics",
            "user_quota": user_quota,
        },
        "auth": {"type": "static", "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [
            {
                "name": name,
                "protocol": protocol,
                "address": "127.0.0.1",
                "port": port,
                "routes": ["loopback"],
            }
            for name, protocol, port in ((UDP, "TURN-UDP", udp), (TCP, "TURN-TCP", tcp))
        ],
        "clusters": [{"name": "loopback", "type": "STATIC", "endpoints": ["127.0.0.0/8"]}],
    }


@contextlib.asynccontextmanager
async def served(
    tmp_path: Path, env: dict[str, str], *args: str, user_quota: int = 0
) -> AsyncIterator[Served]:
    udp, tcp, metrics = free_udp_tcp_port(), free_udp_tcp_port(), free_port()
    settings = {f"STUNNERD_{name}": value for name, value in env.items()}
    server = ManagedStunnerd(
        tmp_path, config(udp, tcp, free_port(), metrics, user_quota), *args, env=settings
    )
    try:
        await server.ready()
        yield Served(server, udp, tcp, metrics)
    finally:
        await server.close()


def error_code(reply: stun.Message) -> int:
    return int(reply.attributes.get("ERROR-CODE", (0, ""))[0])


async def allocate(turn: RawTurn, password: str = PASSWORD) -> int:
    return error_code(
        await turn.request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}, password)
    )


async def test_wrong_passwords_within_the_budget_count_nothing_past_it_the_source(
    tmp_path: Path,
) -> None:
    env = {"AUTH_FAILURE_BURST": "3", "AUTH_FAILURE_RATE_PER_S": "0.01"}
    async with served(tmp_path, env) as s:
        async with RawTurn.open(s.udp) as guesser:
            assert [await allocate(guesser, "guess") for _ in range(3)] == [401] * 3
            await s.moved_to({})  # wrong passwords: verdicts, no limit
            assert [await allocate(guesser, "guess") for _ in range(7)] == [401] * 7
        await s.moved_to({(UDP, "auth_failures_source"): 7})


async def test_a_spent_username_counts_against_the_user_not_the_source(tmp_path: Path) -> None:
    env = {
        "AUTH_FAILURE_BURST": "30",
        "USER_AUTH_FAILURE_BURST": "2",
        "USER_AUTH_FAILURE_RATE_PER_S": "0.01",
    }
    async with served(tmp_path, env) as s:
        for source in ("127.0.0.3", "127.0.0.4"):
            async with RawTurn.open(s.udp, source) as other:
                assert await allocate(other, "guess") == 401
        async with RawTurn.open(s.udp) as guesser:
            assert await allocate(guesser, "guess") == 401  # checked: no failure on record yet
            assert [await allocate(guesser, "guess") for _ in range(5)] == [401] * 5
        await s.moved_to({(UDP, "auth_failures_user"): 5})


async def test_permissions_and_channels_past_their_caps(tmp_path: Path) -> None:
    env = {"MAX_PERMISSIONS_PER_ALLOCATION": "2", "MAX_CHANNELS_PER_ALLOCATION": "2"}
    async with served(tmp_path, env) as s, RawTurn.open(s.udp) as owner:
        assert await allocate(owner) == 0
        permits = [
            error_code(
                await owner.request(
                    stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": (f"127.9.0.{i}", 9)}
                )
            )
            for i in range(1, 6)
        ]
        assert permits == [0, 0, 508, 508, 508]
        await s.moved_to({(UDP, "permissions_per_allocation"): 3})
        channels = [
            error_code(
                await owner.request(
                    stun.Method.CHANNEL_BIND,
                    {"XOR-PEER-ADDRESS": ("127.9.0.1", 7000 + i), "CHANNEL-NUMBER": 0x4000 + i},
                )
            )
            for i in range(4)
        ]
        assert channels == [0, 0, 508, 508]
        await s.moved_to(
            {(UDP, "permissions_per_allocation"): 3, (UDP, "channels_per_allocation"): 2}
        )


async def test_the_user_quota(tmp_path: Path) -> None:
    async with served(tmp_path, {}, user_quota=1) as s:
        async with RawTurn.open(s.udp, "127.0.0.1") as first, RawTurn.open(s.udp) as second:
            assert await allocate(first) == 0
            assert await allocate(second) == 486
            assert await allocate(second) == 486
        await s.moved_to({(UDP, "user_quota"): 2})


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(STEP_S):
            while await reader.read(4096):
                pass
    return True


async def test_connections_past_the_per_source_cap(tmp_path: Path) -> None:
    async with served(tmp_path, {"MAX_CONNECTIONS_PER_SOURCE": "2"}) as s:
        conns = [await connect(s.tcp) for _ in range(5)]
        try:
            await s.moved_to({(TCP, "connections_per_source"): 3})
        finally:
            for _, writer in conns:
                writer.close()


async def test_a_connection_silent_past_the_first_message_timeout(tmp_path: Path) -> None:
    async with served(tmp_path, {"FIRST_MESSAGE_TIMEOUT_S": "0.3"}) as s:
        reader, writer = await connect(s.tcp)
        assert await closed_by_server(reader)
        writer.close()
        await s.moved_to({(TCP, "first_message_timeout"): 1})


async def test_a_trickle_before_allocating(tmp_path: Path) -> None:
    env = {
        "FIRST_MESSAGE_TIMEOUT_S": "0.3",
        "PREAUTH_WINDOW_S": "0.3",
        "PREAUTH_MIN_BYTES_PER_S": "1",
    }
    async with served(tmp_path, env) as s:
        reader, writer = await connect(s.tcp)
        writer.write(BINDING)  # a first message in time, then nothing
        assert await closed_by_server(reader)
        writer.close()
        await s.moved_to({(TCP, "preauth_trickle"): 1})


async def test_two_workers_add_up(tmp_path: Path) -> None:
    """Allocations are opened from new client ports until each worker holds one; each then
    crosses the permission cap once, and the sum over both workers is the metric."""
    env = {"MAX_PERMISSIONS_PER_ALLOCATION": "1"}
    async with (
        served(tmp_path, env, "--udp-thread-num", "2") as s,
        contextlib.AsyncExitStack() as stack,
    ):
        owners = 0
        for _ in range(40):
            owner = await stack.enter_async_context(RawTurn.open(s.udp))
            assert await allocate(owner) == 0
            for i in (1, 2):
                peer = {"XOR-PEER-ADDRESS": (f"127.9.0.{i}", 9)}
                reply = await owner.request(stun.Method.CREATE_PERMISSION, peer)
                assert error_code(reply) == (0 if i == 1 else 508)
            owners += 1
            workers = (await s.server.status())["workers"]
            if owners >= 2 and all(w["allocations"] > 0 for w in workers):
                break
        assert all(w["allocations"] > 0 for w in workers), workers
        await s.moved_to({(UDP, "permissions_per_allocation"): owners})
