"""Fail a test that leaves asyncio tasks running behind it."""

from __future__ import annotations

import asyncio


def leaked_tasks(before: set[asyncio.Task[object]]) -> list[asyncio.Task[object]]:
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t not in before and t is not current and not t.done()]


async def assert_no_leaked_tasks(before: set[asyncio.Task[object]], grace_s: float = 1.0) -> None:
    """Give finishing tasks a moment to end, then fail with the names of those still running."""
    left = leaked_tasks(before)
    if left:
        await asyncio.wait(left, timeout=grace_s)
        left = [t for t in left if not t.done()]
    if left:
        for task in left:
            task.cancel()
        names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in left))
        raise AssertionError(f"test leaked {len(left)} asyncio task(s): {names}")
