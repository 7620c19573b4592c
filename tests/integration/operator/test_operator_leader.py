"""Leader election on a Lease, against kmock's Kubernetes emulator."""

from __future__ import annotations

import asyncio

import pytest

from stunner_common.io.kube.api import KubeApi
from stunner_operator.controller.leader import LEASE, LeaderElector, LeaderOptions

pytestmark = pytest.mark.integration


def elector(api: KubeApi, identity: str) -> LeaderElector:
    options = LeaderOptions(
        namespace="stunner", name="op", identity=identity, lease_duration_s=1, renew_period_s=0.1
    )
    return LeaderElector(api, options)


async def holder(api: KubeApi) -> str | None:
    lease = await api.get(LEASE, "stunner", "op")
    return None if lease is None else lease["spec"].get("holderIdentity")


async def test_the_first_candidate_wins_and_the_second_waits_while_it_renews(api: KubeApi) -> None:
    a, b = elector(api, "a"), elector(api, "b")
    assert await a._try_acquire()
    assert not await b._try_acquire()
    assert await a._try_acquire()  # renewal
    assert not await b._try_acquire()
    assert await holder(api) == "a"


async def test_an_expired_lease_is_taken_over(api: KubeApi) -> None:
    a, b = elector(api, "a"), elector(api, "b")
    assert await a._try_acquire()
    assert not await b._try_acquire()
    b._observed_at -= 2  # the record has not changed for longer than the lease duration
    assert await b._try_acquire()
    lease = await api.get(LEASE, "stunner", "op")
    assert lease is not None
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]) == ("b", 1)


async def test_leading_runs_until_stop_and_then_releases_the_lease(
    no_leaked_tasks: None, api: KubeApi
) -> None:
    a = elector(api, "a")
    started = asyncio.Event()
    finished = asyncio.Event()

    async def lead(lost: asyncio.Event) -> None:
        started.set()
        await lost.wait()
        finished.set()

    stop = asyncio.Event()
    task = asyncio.create_task(a.run(lead, stop), name="elector-a")
    async with asyncio.timeout(5):
        await started.wait()
    assert await holder(api) == "a"
    stop.set()
    async with asyncio.timeout(5):
        await task
    assert finished.is_set()
    assert await holder(api) == ""
    assert await elector(api, "b")._try_acquire()  # a released lease is free at once
