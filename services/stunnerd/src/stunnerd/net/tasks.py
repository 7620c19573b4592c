"""The background tasks of the network edge: each one owned, named, and cancelled on close.

A listener opens relay sockets, asks the cluster-wide quota and runs TLS handshakes in tasks; a
`TaskSet` holds them so that closing the listener cancels and awaits every one (nothing is fire
and forget), and `log_unexpected_exit` reports a long-lived task that stopped on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskSet:
    """Tasks spawned on `loop`, forgotten as they finish; `cancel_all` ends the rest."""

    __slots__ = ("loop", "tasks")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = self.loop.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self.tasks)

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait until they have all ended."""
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)


def log_unexpected_exit(task: asyncio.Task[None]) -> None:
    """A done callback for tasks meant to run until cancelled: log why one stopped."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r", task.get_name(), task.exception())
