"""Capped exponential backoff with jitter, for every reconnect loop (CDS clients, Redis feeds).

Retrying at a fixed pace makes a fleet hammer a restarting server in lockstep. Here the delay
doubles up to a cap and is jittered with "equal jitter": half of the ceiling is fixed and half is
random, so reconnects spread out, never retry instantly and never wait longer than the cap.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """The wait before each retry: ``initial_s`` doubling (by ``factor``) up to ``cap_s``."""

    initial_s: float = 0.25
    cap_s: float = 15.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (0 < self.initial_s <= self.cap_s) or self.factor < 1:
            raise ValueError(
                f"invalid backoff: initial_s={self.initial_s}, cap_s={self.cap_s}, "
                f"factor={self.factor} (want 0 < initial_s <= cap_s and factor >= 1)"
            )

    def ceiling_s(self, attempt: int) -> float:
        """The upper bound of the wait before retry number ``attempt`` (0-based)."""
        return min(self.cap_s, self.initial_s * self.factor ** min(max(attempt, 0), 64))

    def delay_s(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The wait before retry number ``attempt`` (0-based); ``rand()`` returns [0, 1)."""
        ceiling = self.ceiling_s(attempt)
        return ceiling / 2 + rand() * ceiling / 2
