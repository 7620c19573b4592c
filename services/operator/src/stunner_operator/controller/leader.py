"""Leader election on a coordination.k8s.io Lease, so that two replicas never both write.

The algorithm is client-go's: a candidate takes the Lease when it does not exist, when it holds
it already, or when the record has not changed for ``lease_duration_s`` as measured on the
candidate's own monotonic clock (so clock skew between replicas does not matter). Writes carry
the resourceVersion read, so two candidates racing for an expired Lease cannot both win. The
leader renews every ``renew_period_s``; if it cannot renew within the lease duration it stops
leading before anyone else may start. A leader that stops gracefully releases the Lease.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from stunner_common.io.kube.api import ConflictError, KubeApi, KubeApiError
from stunner_operator.k8s.resources import Resource
from stunner_operator.observe import OperatorMetrics

log = logging.getLogger(__name__)

LEASE = Resource("Lease", "coordination.k8s.io", "v1", "leases", True)


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaderOptions:
    """Which Lease a candidate competes for, under which name, and how often it renews;
    ``__main__`` builds it once from the settings (``OPERATOR_LEASE_*``, ``POD_NAMESPACE``)."""

    namespace: str
    name: str
    identity: str
    """This candidate's holder identity (unique per process)."""
    lease_duration_s: int = 15
    renew_period_s: float = 5.0

    def __post_init__(self) -> None:
        if self.renew_period_s >= self.lease_duration_s:
            raise ValueError("renew_period_s must be shorter than lease_duration_s")


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        options: LeaderOptions,
        *,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self._api = api
        self._namespace = options.namespace
        self._name = options.name
        self.identity = options.identity
        self._duration_s = options.lease_duration_s
        self._renew_s = options.renew_period_s
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._metrics = metrics or OperatorMetrics()
        self._read_lease = False
        """Whether the last attempt got an answer from the API server (a standby's health)."""

    async def run(
        self, lead: Callable[[asyncio.Event], Coroutine[Any, Any, None]], stop: asyncio.Event
    ) -> None:
        """Until ``stop``: win the Lease, then run ``lead(lost)`` while holding it."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            if not await self._try_acquire():
                if self._read_lease:
                    self._metrics.mark_standby()
                await self._wait(stop, self._renew_s)
                continue
            self._metrics.mark_leading()
            log.info("leading as %s (lease %s/%s)", self.identity, self._namespace, self._name)
            lost = asyncio.Event()
            async with asyncio.TaskGroup() as tg:
                leader = tg.create_task(lead(lost), name="operator-leading")
                last_renewal = loop.time()
                while not stop.is_set() and not leader.done():
                    await self._wait(stop, self._renew_s)
                    if stop.is_set() or leader.done():
                        break
                    if await self._try_acquire():
                        last_renewal = loop.time()
                    elif loop.time() - last_renewal >= self._duration_s - self._renew_s:
                        log.warning("lost the lease %s/%s", self._namespace, self._name)
                        break
                lost.set()
            self._metrics.mark_not_leading()
            if stop.is_set():
                await self._release()

    async def _wait(self, stop: asyncio.Event, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await stop.wait()
        except TimeoutError:
            pass

    def _expired(self, lease: dict[str, Any]) -> bool:
        spec = lease.get("spec") or {}
        record = (
            spec.get("holderIdentity"),
            spec.get("renewTime"),
            spec.get("acquireTime"),
            spec.get("leaseTransitions"),
        )
        now = asyncio.get_running_loop().time()
        if record != self._observed:
            self._observed = record
            self._observed_at = now
        if not spec.get("holderIdentity"):
            return True
        duration = spec.get("leaseDurationSeconds") or self._duration_s
        return bool(now - self._observed_at >= duration)

    async def _try_acquire(self) -> bool:
        now = _micro_time()
        self._read_lease = False
        try:
            lease = await self._api.get(LEASE, self._namespace, self._name)
            self._read_lease = True
            if lease is None:
                await self._api.create(
                    LEASE,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self._name, "namespace": self._namespace},
                        "spec": {
                            "holderIdentity": self.identity,
                            "leaseDurationSeconds": self._duration_s,
                            "acquireTime": now,
                            "renewTime": now,
                            "leaseTransitions": 0,
                        },
                    },
                )
                return True
            spec = dict(lease.get("spec") or {})
            holder = spec.get("holderIdentity")
            if holder != self.identity and not self._expired(lease):
                return False
            if holder != self.identity:
                spec["acquireTime"] = now
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec.update(
                holderIdentity=self.identity, renewTime=now, leaseDurationSeconds=self._duration_s
            )
            lease["spec"] = spec
            await self._api.update(LEASE, lease)
            return True
        except ConflictError:
            return False
        except KubeApiError as err:
            log.warning("lease %s/%s: %s", self._namespace, self._name, err)
            return False

    async def _release(self) -> None:
        try:
            lease = await self._api.get(LEASE, self._namespace, self._name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"] = {**lease["spec"], "holderIdentity": "", "renewTime": _micro_time()}
            await self._api.update(LEASE, lease)
            log.info("released the lease %s/%s", self._namespace, self._name)
        except KubeApiError as err:
            log.warning("releasing lease %s/%s failed: %s", self._namespace, self._name, err)
