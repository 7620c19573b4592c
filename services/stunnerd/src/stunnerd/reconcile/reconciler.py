"""The one way a config reaches a running stunnerd: dataplane first, then the admin endpoints.

`Reconciler.apply` is called for every config a stunnerd process takes (the one-shot load, each
config a watched origin delivers, the default config of a TURN URI). It plans the change against
the config in force, hands the config to the dataplane (this process's listeners, reconciled by
`ListenerReconciler`, or every worker process), and once the dataplane took it, brings the health
and metrics servers and the log level to the config. It keeps the count of configs applied,
rejected and ignored (zero configs, configs during a drain) and the revision in force, which
`/status` reports. A config the dataplane rejects changes nothing; an admin endpoint that cannot
be bound is logged and the listeners keep the new config (upstream behaves the same).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from stunner_common.config import StunnerConfig
from stunnerd.reconcile.dataplane import ApplyOutcome, Dataplane
from stunnerd.reconcile.plan import Plan, plan_reconcile

log = logging.getLogger(__name__)


class AdminTarget(Protocol):
    """The admin servers (health, metrics) and the log level."""

    async def apply_admin(self, config: StunnerConfig, plan: Plan) -> None: ...


class Reconciler:
    """Applies configs to `dataplane`, then to `admin`; `running` is the config in force."""

    def __init__(
        self,
        dataplane: Dataplane,
        admin: AdminTarget,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._dataplane = dataplane
        self._admin = admin
        self._clock = clock
        self.running: StunnerConfig | None = None
        self.revision: int | None = None
        self.applied_count = 0
        self.rejected_count = 0
        self.ignored_count = 0

    def counts(self) -> dict[str, int]:
        return {
            "applied": self.applied_count,
            "rejected": self.rejected_count,
            "ignored": self.ignored_count,
        }

    async def apply(self, config: StunnerConfig, *, revision: int | None = None) -> ApplyOutcome:
        received = self._clock()
        plan = plan_reconcile(self.running, config)
        outcome = await self._dataplane.apply(config)
        if outcome.error is not None:
            self.rejected_count += 1
            log.error("config not applied, running configuration unchanged: %s", outcome.error)
            return outcome
        if outcome.ignored:
            self.ignored_count += 1
            return outcome
        try:
            await self._admin.apply_admin(config, plan)
        except (OSError, ValueError) as exc:
            log.error("admin servers: %s", exc)
        self.running = config
        if revision is not None:
            self.revision = revision
        self.applied_count += 1
        log.debug("config handled in %.1f ms", (self._clock() - received) * 1e3)
        return outcome
