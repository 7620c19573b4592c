"""Listener retries: a listener left out for a reason that may pass is tried again, with backoff.

The `Reconciler` knows which listeners are retrying and how many tries in a row failed
(`retry_attempt`). `ListenerRetry` turns that into one timer on the event loop (capped, jittered
backoff), runs `Reconciler.retry` one at a time in an owned task, and hands each outcome to
`on_outcome`, which schedules the next retry. Nothing is retried once `stopped()` is true (drain).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from stunner_common.backoff import Backoff
from stunnerd.reconcile.reconciler import Reconciler
from stunnerd.status import ApplyOutcome

log = logging.getLogger(__name__)


class ListenerRetry:
    def __init__(
        self,
        reconciler: Reconciler,
        backoff: Backoff,
        *,
        on_outcome: Callable[[ApplyOutcome], None],
        stopped: Callable[[], bool],
    ) -> None:
        self._reconciler = reconciler
        self._backoff = backoff
        self._on_outcome = on_outcome
        self._stopped = stopped
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def schedule(self) -> None:
        """Arm the timer for the next retry, if a listener is retrying (replaces any armed)."""
        self._disarm()
        attempt = self._reconciler.retry_attempt()
        if attempt is None or self._stopped():
            return
        delay_s = self._backoff.delay_s(attempt)
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._start)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _start(self) -> None:
        self._timer = None
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._retry(), name="stunnerd-listener-retry")
            self._task.add_done_callback(_log_failed)

    async def _retry(self) -> None:
        if self._stopped():
            return
        try:
            outcome = await self._reconciler.retry()
        except Exception:
            log.exception("retrying the listeners left out failed unexpectedly")
            self.schedule()
            return
        if outcome is not None:
            self._on_outcome(outcome)

    async def stop(self) -> None:
        self._disarm()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _log_failed(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed: %r", task.get_name(), task.exception())
