"""`Dataplane`: what the `Reconciler` and the command drive, here or in worker processes.

Implemented by `stunnerd.workers.local.LocalDataplane` (this process's `TurnServer`) and
`stunnerd.workers.pool.WorkerPool` (`--udp-thread-num` worker processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from stunner_common.config import StunnerConfig
from stunnerd.admin.stats import StatsSnapshot


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """What applying one config did (summed over workers where there are several)."""

    applied: bool
    ignored: bool = False
    restarted: tuple[str, ...] = ()
    error: str | None = None
    duration_s: float = 0.0
    started: tuple[tuple[str, int], ...] = ()
    """(listener name, bound port) of every listener this config started or restarted."""


class Dataplane(Protocol):
    async def start(self) -> None: ...

    async def apply(self, config: StunnerConfig) -> ApplyOutcome: ...

    def stats(self) -> StatsSnapshot:
        """The last known counters (cheap; no I/O)."""

    async def refresh(self) -> None:
        """Bring `stats()` up to date (asks the workers, if any)."""

    def worker_status(self) -> list[dict[str, Any]] | None:
        """Per-worker process ids and allocation counts for `/status`; None without workers."""

    async def allocations(self) -> int: ...

    async def stop_accepting(self) -> None:
        """Refuse new allocations from now on; live ones keep running (drain)."""

    async def close(self) -> None: ...
