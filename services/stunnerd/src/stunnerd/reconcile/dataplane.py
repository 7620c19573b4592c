"""`Dataplane`: what the `Reconciler` and the command drive, here or in worker processes.

Implemented by `stunnerd.workers.local.LocalDataplane` (this process's `TurnServer`) and
`stunnerd.workers.pool.WorkerPool` (`--udp-thread-num` worker processes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from stunner_common.config import StunnerConfig
from stunnerd.admin.stats import StatsSnapshot

ListenerStateName = Literal["serving", "retrying", "rejected"]


@dataclass(frozen=True, slots=True)
class ListenerState:
    """Where one configured listener stands.

    ``serving``: bound and answering. ``retrying``: it could not be brought up for a reason that
    may pass (a port in use, a bind error) and is tried again with backoff. ``rejected``: it
    cannot work as configured (TLS material that does not load, ...) and waits for a config that
    changes it. ``cause`` is the short label metrics count failures by; ``attempts`` counts the
    failed tries in a row.
    """

    name: str
    state: ListenerStateName
    reason: str = ""
    cause: str = ""
    attempts: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "reason": self.reason,
            "cause": self.cause,
            "attempts": self.attempts,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ListenerState:
        state = str(data.get("state", "rejected"))
        return ListenerState(
            str(data["name"]),
            state if state in ("serving", "retrying", "rejected") else "rejected",  # type: ignore[arg-type]
            str(data.get("reason", "")),
            str(data.get("cause", "")),
            int(data.get("attempts", 0)),
        )


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
    listeners: tuple[ListenerState, ...] = ()
    """The state of every listener of the config in force after this apply."""


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
