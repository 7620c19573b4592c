"""The one way a config reaches a running stunnerd: dataplane first, then the admin endpoints.

`Reconciler.apply` is called for every config a stunnerd process takes (the one-shot load, each
config a watched origin delivers, the default config of a TURN URI). It plans the change against
the config in force, hands the config to the dataplane (this process's listeners, reconciled by
`ListenerReconciler`, or every worker process), and once the dataplane took it, brings the health
and metrics servers and the log level to the config. The dataplane applies listener by listener:
a listener that cannot come up is left out and reported in `listeners` (`retry` tries those
that may come up later again; the caller schedules it with backoff). A config is *rejected* only
when it is invalid as a whole (`reject`, from the origin) or the dataplane refuses it whole; the
reason is kept in `last_rejection`. It counts configs applied, rejected and ignored (zero configs,
configs during a drain), apply failures by cause (`failures`), and keeps the revision and store
epoch in force, all of which `/status` and the metrics report. An admin endpoint that cannot be
bound is counted and reported, and changes nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Protocol

from stunner_common.config import StunnerConfig
from stunnerd.reconcile.dataplane import Dataplane
from stunnerd.reconcile.plan import plan_reconcile
from stunnerd.status import ApplyOutcome, ListenerState, Plan, Rejection

log = logging.getLogger(__name__)


class AdminTarget(Protocol):
    """The admin servers (health, metrics) and the log level."""

    async def apply_admin(self, config: StunnerConfig, plan: Plan) -> Mapping[str, str]:
        """Bring the admin surface to `config`; return {cause: reason} of what failed."""


class Reconciler:
    """Applies configs to `dataplane`, then to `admin`; `running` is the config in force."""

    def __init__(
        self,
        dataplane: Dataplane,
        admin: AdminTarget,
        *,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._dataplane = dataplane
        self._admin = admin
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = asyncio.Lock()
        self.running: StunnerConfig | None = None
        self.revision: int | None = None
        self.epoch: str | None = None
        self.applied_count = 0
        self.rejected_count = 0
        self.ignored_count = 0
        self.last_rejection: Rejection | None = None
        self.listeners: dict[str, ListenerState] = {}
        self.failures: Counter[str] = Counter()
        """Apply failures by cause: one per listener that failed to come up (each try), per
        config rejected whole, per admin endpoint that could not be bound."""

    def counts(self) -> dict[str, int]:
        return {
            "applied": self.applied_count,
            "rejected": self.rejected_count,
            "ignored": self.ignored_count,
        }

    @property
    def serving(self) -> int:
        """How many listeners serve now."""
        return sum(1 for state in self.listeners.values() if state.state == "serving")

    def retry_attempt(self) -> int | None:
        """The backoff step of the next retry (0-based), or None when nothing is retrying."""
        attempts = [s.attempts for s in self.listeners.values() if s.state == "retrying"]
        return min(attempts) - 1 if attempts else None

    def reject(self, reason: str, *, revision: int | None = None, epoch: str | None = None) -> None:
        """A config refused before it reached the dataplane (invalid as a whole)."""
        self.rejected_count += 1
        self.failures["invalid_config"] += 1
        self.last_rejection = Rejection(reason, revision, epoch, self._wall_clock())
        log.error("config rejected, running configuration unchanged: %s", reason)

    async def apply(
        self, config: StunnerConfig, *, revision: int | None = None, epoch: str | None = None
    ) -> ApplyOutcome:
        async with self._lock:
            received = self._clock()
            plan = plan_reconcile(self.running, config)
            outcome = await self._dataplane.apply(config)
            if outcome.error is not None:
                self.rejected_count += 1
                self.failures["dataplane_error"] += 1
                self.last_rejection = Rejection(outcome.error, revision, epoch, self._wall_clock())
                log.error("config not applied, running configuration unchanged: %s", outcome.error)
                return outcome
            if outcome.ignored:
                self.ignored_count += 1
                return outcome
            self._record(outcome.listeners)
            for cause, reason in (await self._admin.apply_admin(config, plan)).items():
                self.failures[cause] += 1
                log.error("admin servers: %s", reason)
            self.running = config
            if revision is not None:
                self.revision = revision
                self.epoch = epoch
            self.applied_count += 1
            log.debug("config handled in %.1f ms", (self._clock() - received) * 1e3)
            return outcome

    async def retry(self) -> ApplyOutcome | None:
        """Try the listeners of the config in force that are not serving again."""
        async with self._lock:
            if self.running is None or self.retry_attempt() is None:
                return None
            outcome = await self._dataplane.apply(self.running)
            if outcome.error is None and not outcome.ignored:
                self._record(outcome.listeners)
            return outcome

    def _record(self, states: tuple[ListenerState, ...]) -> None:
        """Keep the listener states, counting every new failure (a retry that failed again
        has one more attempt, so it counts again)."""
        fresh: dict[str, ListenerState] = {}
        for state in states:
            if state.state != "serving" and self.listeners.get(state.name) != state:
                self.failures[state.cause or state.state] += 1
            fresh[state.name] = state
        self.listeners = fresh
