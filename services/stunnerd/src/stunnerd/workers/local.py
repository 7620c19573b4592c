"""The TURN server of this process, driven by the reconciler.

The C relay (`stunnerd.fastpath`) is wired in here, where it was built and the server's tuning
asks for it (`STUNNERD_FASTPATH`), unless the server was given one.

Draining refuses new allocations by swapping in a quota policy that admits nobody, so an
Allocate during drain is answered 486 (Allocation Quota Reached) while every live allocation,
permission and channel keeps working. Configs that arrive after the drain started are not
applied.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from stunner_common.config import StunnerConfig
from stunnerd import fastpath
from stunnerd.net.server import TurnServer
from stunnerd.reconcile.listeners import ListenerReconciler, ReconcileError
from stunnerd.status import ApplyOutcome, ClusterStats, ListenerStats, StatsSnapshot, TrafficStats
from stunnerd.turn.policies import UserQuota

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _NoNewAllocations(UserQuota):
    """A quota that admits no new allocation: the drain policy."""

    def allows(self, user_id: str, usage: Mapping[str, int]) -> bool:
        return False

    @property
    def refusal(self) -> str:
        return ""  # draining is no limit: the 486 is counted by code only


class LocalDataplane:
    def __init__(self, server: TurnServer | None = None) -> None:
        self.server = server if server is not None else TurnServer()
        if self.server.fastpath is None:
            self.server.fastpath = fastpath.factory(self.server.tuning.fastpath)
        self.reconciler = ListenerReconciler(self.server)
        self.draining = False

    async def start(self) -> None:
        return None

    async def apply(self, config: StunnerConfig) -> ApplyOutcome:
        if self.draining:
            log.info("draining: not applying a new config")
            return ApplyOutcome(applied=False, ignored=True)
        try:
            result = await self.reconciler.apply(config)
        except ReconcileError as exc:
            return ApplyOutcome(applied=False, error=str(exc))
        if self.server.offload is not None and not result.ignored:
            self.server.offload.configure(
                config.admin.offload_engine, config.admin.offload_interfaces
            )
        return ApplyOutcome(
            applied=result.applied,
            ignored=result.ignored,
            restarted=result.restarted,
            duration_s=result.duration_s,
            started=tuple(
                (name, self.server.port_of(name))
                for name in result.started
                if name in self.server.listeners
            ),
            listeners=result.listeners,
        )

    def stats(self) -> StatsSnapshot:
        """Counts of the running listeners; clusters once they have carried a datagram."""
        server = self.server
        server.fold_counters()
        return StatsSnapshot(
            tuple(
                ListenerStats(
                    name,
                    allocations=lst.allocation_count,
                    connections=lst.connections,
                    connections_total=lst.connections_total,
                    traffic=TrafficStats(*server.listener_traffic.get(name, (0, 0, 0, 0))),
                    refusals=tuple(sorted(lst.engine.refusals.counts.items())),
                    limit_refusals=lst.engine.refusals.limit_counts(),
                )
                for name, lst in sorted(server.listeners.items())
            ),
            tuple(
                ClusterStats(name, TrafficStats(*counts))
                for name, counts in sorted(server.cluster_traffic.items())
                if counts[0] or counts[2]
            ),
        )

    async def refresh(self) -> None:
        if self.server.offload is not None:
            self.server.offload.poll()  # what the kernel relayed, into the traffic counters

    def offload_status(self) -> dict[str, Any]:
        if self.server.offload is None:
            return {"engine": "None", "active": False, "reason": "not available in this process"}
        return self.server.offload.status()

    def quota_status(self) -> dict[str, Any] | None:
        """The cluster-wide user quota's state; None when user_quota counts per process."""
        return self.server.quota.status() if self.server.quota is not None else None

    def worker_status(self) -> None:
        return None

    async def allocations(self) -> int:
        return self.server.allocation_count

    async def stop_accepting(self) -> None:
        self.draining = True
        for lst in self.server.listeners.values():
            policies = lst.engine.policies
            lst.set_policies(dataclasses.replace(policies, quota=_NoNewAllocations()))

    async def close(self) -> None:
        await self.server.close()
