"""Capped exponential backoff with jitter for reconnecting to the CDS.

Upstream retried every second forever, so a fleet of dataplanes hammered a restarting CDS in
lockstep. Here the delay doubles up to a cap and is jittered ("equal jitter": half fixed, half
random), so reconnects spread out yet never retry instantly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 0.25
    cap_s: float = 15.0
    factor: float = 2.0

    def delay_s(self, attempt: int, rand: Callable[[], float]) -> float:
        """The wait before retry number `attempt` (0-based); `rand()` returns [0, 1)."""
        ceiling = min(self.cap_s, self.initial_s * self.factor ** min(attempt, 64))
        return ceiling / 2 + rand() * ceiling / 2
