"""Graceful shutdown: stop being ready, stop taking allocations, wait for the last one to end.

Upstream waited with no deadline (only Kubernetes' SIGKILL ended it). Here the wait is bounded by
the grace period; SIGINT uses a shorter one, and a second signal ends the wait at once. The
allocation count is sampled on an interval because it is the sum over listeners and workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from stunnerd.status import Lifecycle

log = logging.getLogger(__name__)

DRAIN_CHECK_INTERVAL_S = 0.2


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    drained: bool
    left: int
    waited_s: float


async def drain(
    lifecycle: Lifecycle,
    *,
    allocations: Callable[[], Awaitable[int]],
    stop_accepting: Callable[[], Awaitable[None]],
    grace_period_s: float,
    abort: asyncio.Event | None = None,
    check_interval_s: float = DRAIN_CHECK_INTERVAL_S,
) -> DrainOutcome:
    """Turn /ready to 503, refuse new allocations, and wait for the count to reach zero."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    lifecycle.draining = True
    await stop_accepting()
    left = await allocations()
    log.info("draining: %d allocation(s) left, grace period %.0f s", left, grace_period_s)
    deadline = started + grace_period_s
    while left > 0:
        now = loop.time()
        if now >= deadline:
            log.warning("grace period over with %d allocation(s) left", left)
            return DrainOutcome(False, left, now - started)
        if abort is not None and abort.is_set():
            log.warning("drain aborted with %d allocation(s) left", left)
            return DrainOutcome(False, left, now - started)
        wait = min(check_interval_s, deadline - now)
        if abort is not None:
            try:
                async with asyncio.timeout(wait):
                    await abort.wait()
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(wait)
        left = await allocations()
    log.info("drained: no allocations left")
    return DrainOutcome(True, 0, loop.time() - started)
