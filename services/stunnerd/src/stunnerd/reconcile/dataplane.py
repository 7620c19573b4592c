"""`Dataplane`: what the `Reconciler` and the command drive, here or in worker processes.

Implemented by `stunnerd.workers.local.LocalDataplane` (this process's `TurnServer`) and
`stunnerd.workers.pool.WorkerPool` (`--udp-thread-num` worker processes).
"""

from __future__ import annotations

from typing import Any, Protocol

from stunner_common.config import StunnerConfig
from stunnerd.status import ApplyOutcome, StatsSnapshot


class Dataplane(Protocol):
    async def start(self) -> None: ...

    async def apply(self, config: StunnerConfig) -> ApplyOutcome: ...

    def stats(self) -> StatsSnapshot:
        """The last known counters (cheap; no I/O)."""

    async def refresh(self) -> None:
        """Bring `stats()` up to date (asks the workers, if any)."""

    def worker_status(self) -> list[dict[str, Any]] | None:
        """Per-worker process ids and allocation counts for `/status`; None without workers."""

    def offload_status(self) -> dict[str, Any]:
        """`/status`'s `offload`: the kernel offload's engine, state and counts."""

    def quota_status(self) -> dict[str, Any] | None:
        """The cluster-wide user quota's state; None when `user_quota` counts per process."""

    async def allocations(self) -> int: ...

    async def stop_accepting(self) -> None:
        """Refuse new allocations from now on; live ones keep running (drain)."""

    async def close(self) -> None: ...
