"""The cluster-wide user quota: three stunnerd processes of one Gateway share one redis-server.

A quota-3 user gets three allocations, spread over the replicas; the fourth is refused with 486
whichever replica it reaches. A replica killed with SIGKILL releases nothing, yet its slot comes
back once its lease runs out. With Redis gone each replica admits its share (3 // 3 = 1) and
says so in /status; with Redis back the leases granted meanwhile are counted there again.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aioice.stun import TransactionFailed
from aioice.turn import TurnTransport, create_turn_endpoint

from stunner_common.contracts.redis_keys import QuotaKey
from stunnerd.quota import ClusterQuota, QuotaSettings
from support.ports import free_port, free_udp_tcp_port
from support.redis_server import RedisServer
from support.stunnerd_process import PASSWORD, USER, ManagedStunnerd, TurnReceiver, base_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

QUOTA = 3
REPLICAS = 3
STEP_S = 20.0
KEY = QuotaKey("default/gw", "stunner.l7mp.io", USER).encode()


async def allocate(port: int) -> TurnTransport | int:
    """An allocation of USER on the replica at `port`, or the error code it was refused with."""
    try:
        async with asyncio.timeout(STEP_S):
            transport, _ = await create_turn_endpoint(
                TurnReceiver, server_addr=("127.0.0.1", port), username=USER, password=PASSWORD
            )
    except TransactionFailed as exc:
        return int(exc.response.attributes["ERROR-CODE"][0])
    return transport


async def allocated(port: int) -> TurnTransport:
    got = await allocate(port)
    assert not isinstance(got, int), f"allocation on :{port} refused with {got}"
    return got


async def key_count_reaches(client: aioredis.Redis, count: int) -> int:
    """Poll the user's lease count in Redis until it is `count` (bounded: STEP_S)."""
    seen = -1
    for _ in range(int(STEP_S / 0.05)):
        seen = await client.zcard(KEY)
        if seen == count:
            break
        await asyncio.sleep(0.05)
    return seen


def replica_config(port: int, health: int) -> dict[str, Any]:
    config = base_config(health, {"udp": port})
    config["admin"]["user_quota"] = QUOTA
    return copy.deepcopy(config)


class Replicas:
    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.ports: list[int] = []
        self.procs: list[ManagedStunnerd] = []
        env = {
            "STUNNERD_QUOTA_REDIS_URL": redis_url,
            "STUNNERD_QUOTA_REPLICAS": str(REPLICAS),
            "STUNNERD_QUOTA_LEASE_S": "2",
            "STUNNERD_QUOTA_GRACE_S": "0.5",
            "STUNNERD_QUOTA_RETRY_S": "0.5",
            "STUNNERD_QUOTA_REDIS_TIMEOUT_S": "3",
        }
        for i in range(REPLICAS):
            port = free_udp_tcp_port()
            workdir = tmp / f"replica-{i}"
            workdir.mkdir()
            proc = ManagedStunnerd(workdir, replica_config(port, free_port()), env=env)
            self.ports.append(port)
            self.procs.append(proc)

    async def ready(self) -> None:
        for proc in self.procs:
            await proc.ready()

    async def close(self) -> None:
        for proc in self.procs:
            await proc.close()


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path / "redis-data", persist=False)
    (tmp_path / "redis-data").mkdir()
    server.start()
    yield server
    server.stop()


async def test_the_quota_holds_across_replicas_and_a_killed_replicas_slot_comes_back(
    tmp_path: Path, redis: RedisServer
) -> None:
    transports: list[TurnTransport] = []
    client = aioredis.Redis.from_url(redis.url)
    replicas = Replicas(tmp_path, redis.url)  # the processes start here
    try:
        await replicas.ready()
        for port in replicas.ports:
            transports.append(await allocated(port))
        assert await client.zcard(KEY) == QUOTA
        for port in replicas.ports:
            assert await allocate(port) == 486  # the fourth, whichever replica it reaches
        status = await replicas.procs[1].status()
        assert status["user_quota"]["mode"] == "cluster", status
        assert status["user_quota"]["limit"] == QUOTA

        victim = replicas.procs[0]
        os.kill(victim.proc.pid, signal.SIGKILL)  # no deallocation, no lease released
        victim.proc.stop()
        got: TurnTransport | int = 486
        deadline = asyncio.get_running_loop().time() + STEP_S
        while isinstance(got, int) and asyncio.get_running_loop().time() < deadline:
            assert got == 486, f"unexpected refusal {got}"
            got = await allocate(replicas.ports[1])
            if isinstance(got, int):
                await asyncio.sleep(0.2)
        assert not isinstance(got, int), "the killed replica's slot never came back"
        transports.append(got)
        assert await allocate(replicas.ports[2]) == 486
        assert await client.zcard(KEY) == QUOTA

        # Redis goes away: each replica admits its share, 1 per user, and says so.
        redis.stop()
        assert await allocate(replicas.ports[2]) == 486  # it holds one already
        status = await replicas.procs[2].status()
        assert status["user_quota"]["mode"] == "local-share", status
        assert status["user_quota"]["share"] == 1
        assert "redis unreachable" in status["user_quota"]["reason"]

        # Redis is back, empty: the replicas write their live leases back (replica 1 holds
        # two, replica 2 one), so the quota is full again.
        redis.start()
        await client.aclose()
        client = aioredis.Redis.from_url(redis.url)
        # each replica writes its leases back at its next renewal
        assert await key_count_reaches(client, QUOTA) == QUOTA
        assert await allocate(replicas.ports[2]) == 486
        assert (await replicas.procs[2].status())["user_quota"]["mode"] == "cluster"
        assert await allocate(replicas.ports[1]) == 486
        assert await client.zcard(KEY) == QUOTA
    finally:
        for transport in transports:
            transport.close()
        with contextlib.suppress(Exception):
            await client.aclose()
        await replicas.close()


async def test_a_lease_lasts_as_long_as_its_allocation_and_ends_with_it(
    tmp_path: Path, redis: RedisServer
) -> None:
    port = free_udp_tcp_port()
    env = {"STUNNERD_QUOTA_REDIS_URL": redis.url, "STUNNERD_QUOTA_GRACE_S": "0"}
    proc = ManagedStunnerd(tmp_path, replica_config(port, free_port()), env=env)
    client = aioredis.Redis.from_url(redis.url)
    try:
        await proc.ready()
        transport = await allocated(port)
        assert await client.zcard(KEY) == 1
        ttl_ms = await client.pttl(KEY)
        assert 590_000 < ttl_ms <= 600_000  # the allocation's default lifetime, 600 s
        transport.close()  # aioice deletes the allocation (Refresh, LIFETIME 0)
        assert await key_count_reaches(client, 0) == 0
        assert (await proc.status())["user_quota"]["leases"] == 0
    finally:
        await client.aclose()
        await proc.close()


async def test_without_redis_each_replica_admits_its_share_per_user() -> None:
    closed = free_port()  # nothing listens: every connection is refused at once
    quota = ClusterQuota(QuotaSettings(f"redis://127.0.0.1:{closed}/0", replicas=2, retry_s=60))
    quota.configure("ns/gw", "realm", 4)
    try:
        assert quota.share == 2
        assert await quota.acquire("u1", "l1", 600)
        assert await quota.acquire("u1", "l2", 600)
        assert not await quota.acquire("u1", "l3", 600)  # past the share of 4 // 2
        assert await quota.acquire("u2", "l4", 600)  # per user
        status = quota.status()
        assert status["mode"] == "local-share"
        assert status["share"] == 2
        assert status["refused"] == 1
        assert "redis unreachable" in status["reason"]
        quota.release("l1")
        assert await quota.acquire("u1", "l5", 600)  # a released slot is free again
        assert quota.held("u1") == 2
    finally:
        await quota.close()


async def test_worker_processes_share_the_quota_through_redis(
    tmp_path: Path, redis: RedisServer
) -> None:
    port = free_udp_tcp_port()
    config = replica_config(port, free_port())
    config["admin"]["user_quota"] = 2
    env = {"STUNNERD_QUOTA_REDIS_URL": redis.url, "STUNNERD_QUOTA_REDIS_TIMEOUT_S": "3"}
    proc = ManagedStunnerd(tmp_path, config, "--udp-thread-num", "2", env=env)
    transports: list[TurnTransport] = []
    client = aioredis.Redis.from_url(redis.url)
    try:
        await proc.ready()
        # five clients, each from its own port: the kernel spreads them over both workers
        results = [await allocate(port) for _ in range(5)]
        transports = [r for r in results if not isinstance(r, int)]
        assert len(transports) == 2, results
        assert sorted(r for r in results if isinstance(r, int)) == [486, 486, 486]
        assert await client.zcard(KEY) == 2
        # /status tells where the workers count: all of them in Redis.
        status = await proc.wait_status(
            lambda doc: len((doc.get("user_quota") or {}).get("workers") or []) == 2,
            "the workers' quota state in /status",
        )
        assert status["user_quota"]["mode"] == "cluster"
        assert {w["mode"] for w in status["user_quota"]["workers"]} == {"cluster"}
    finally:
        for transport in transports:
            transport.close()
        await client.aclose()
        await proc.close()
