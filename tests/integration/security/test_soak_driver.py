"""A short soak: the driver of `python -m bench soak` against stunnerd's server, scaled down.

The full soak (`make soak`: 1000 slots, 10 minutes) is a bench; this checks that its driver does
what the figures rely on: every slot allocates, binds, relays and ends its allocation (deleted
or left to expire), the server ends with no allocation and the fds and tasks it started with.
"""

from __future__ import annotations

import pytest

from support.bench_modules import bench_module

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


async def test_a_short_soak_churns_allocations_and_leaves_nothing_behind() -> None:
    bench_soak = bench_module("bench_soak")
    result = await bench_soak.drive(seconds=8.0, slots=20, warmup_s=2.0)
    driver = result["driver"]
    assert driver["allocations"] >= 20, driver
    assert driver["deleted"] + driver["abandoned"] >= 20, driver
    assert driver["peak_live"] == 20, driver
    assert driver["echoed"] > 0, driver
    assert not [k for k in driver["failure_kinds"] if k.startswith("no answer")], driver
    base, after = result["baseline"], result["after"]
    assert after["allocations"] == 0
    assert (after["fds"], after["tasks"]) == (base["fds"], base["tasks"])
