"""Faults with live traffic: a relay keeps flowing while the CDS, Redis or the operator is killed.

Each test runs the real stack (redis-server, operator in local mode, CDS, stunnerd watching the
CDS), opens one TURN allocation that sends a datagram every 10 ms to a UDP echo peer, SIGKILLs one
component, edits a manifest while it is down, and restarts it. The allocation must lose nothing,
and the edit must be in force in stunnerd (its `/status`) soon after the component is back: the
time is reported in the test output; the test waits for it with a bounded timeout only.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from stunner_common.contracts.redis_keys import CONFIGS_HASH, REV_COUNTER
from support.echo import echo_peer
from support.security_stack import GATEWAY, SteadyRelay, running_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

# How long each component stays dead, with traffic flowing. The CDS stays away long enough for
# stunnerd's reconnect backoff to reach its cap: the edit must still follow soon after its return.
DOWN_S = {"cds0": 5.0, "redis": 1.5, "operator": 1.5}


@pytest.mark.parametrize("component", sorted(DOWN_S))
async def test_killing_a_component_loses_no_packet_and_an_edit_made_meanwhile_applies_on_return(
    tmp_path: Path, component: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_stack(tmp_path) as stack, echo_peer() as (_echo, peer):
        async with SteadyRelay(
            stack.udp_port, peer, stack.secrets.user, stack.secrets.password
        ) as relay:
            await asyncio.sleep(0.5)
            assert relay.received() > 0, stack.tail()
            stack.kill(component)
            sent_at_kill = relay.sent
            await asyncio.sleep(0.3)
            stack.add_prefix("127.0.0.2/32")
            await asyncio.sleep(DOWN_S[component])
            assert relay.sent - sent_at_kill >= 20, "traffic flows while the component is dead"
            await stack.restart_soon(component)
            took = await stack.wait_status(
                lambda s: "127.0.0.2" in stack.endpoints_of(s),
                f"the edit made while {component} was down",
            )
            await asyncio.sleep(0.5)
            lost = await relay.stop()
            assert lost == 0, f"{lost} of {relay.sent} datagrams lost\n{stack.tail()}"
        with capsys.disabled():
            print(
                f"\n[faults] {component}: edit in force {took:.2f} s after restart, "
                f"0/{relay.sent} lost"
            )


async def test_redis_restarted_empty_gets_every_config_again_and_the_relay_never_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_stack(tmp_path) as stack, echo_peer() as (_echo, peer):
        store = aioredis.Redis.from_url(stack.redis.url)
        before = sorted(await store.hkeys(CONFIGS_HASH))
        assert GATEWAY.encode() in before
        # a revision no fresh Redis reaches soon: seeing a small one later proves the data went
        await store.incrby(REV_COUNTER, 1000)
        await store.aclose()
        async with SteadyRelay(
            stack.udp_port, peer, stack.secrets.user, stack.secrets.password
        ) as relay:
            await asyncio.sleep(0.5)
            stack.kill("redis")
            stack.wipe_redis()
            await stack.restart_soon("redis")
            started = time.monotonic()
            store = aioredis.Redis.from_url(stack.redis.url)
            try:
                while sorted(await store.hkeys(CONFIGS_HASH)) != before:
                    assert time.monotonic() - started < 30, stack.tail()
                    await asyncio.sleep(0.05)
                took = time.monotonic() - started
                assert int(await store.get(REV_COUNTER) or 0) < 1000  # republished, not kept
            finally:
                await store.aclose()
            # the chain works again end to end: an edit now reaches stunnerd
            stack.add_prefix("127.0.0.2/32")
            await stack.wait_status(lambda s: "127.0.0.2" in stack.endpoints_of(s), "an edit")
            lost = await relay.stop()
            assert lost == 0, f"{lost} of {relay.sent} datagrams lost\n{stack.tail()}"
        with capsys.disabled():
            print(f"\n[faults] empty Redis: every config back in {took:.2f} s, 0/{relay.sent} lost")


async def test_a_dying_cds_replica_moves_its_watchers_to_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_stack(tmp_path, cds_replicas=2) as stack, echo_peer() as (_echo, peer):
        first, second = (f"127.0.0.1:{port}" for port in stack.cds_ports)
        assert stack.grep(f"CDS watch ws://{first}/"), "stunnerd starts on the first replica"
        async with SteadyRelay(
            stack.udp_port, peer, stack.secrets.user, stack.secrets.password
        ) as relay:
            await asyncio.sleep(0.5)
            stack.kill("cds0")  # and it stays dead
            started = time.monotonic()
            stack.add_prefix("127.0.0.2/32")
            await stack.wait_status(lambda s: "127.0.0.2" in stack.endpoints_of(s), "the edit")
            took = time.monotonic() - started
            lost = await relay.stop()
            assert lost == 0, f"{lost} of {relay.sent} datagrams lost\n{stack.tail()}"
        assert stack.grep(f"CDS watch ws://{second}/"), stack.tail()
        with capsys.disabled():
            print(f"\n[faults] CDS replica died: edit in force via the other in {took:.2f} s")
