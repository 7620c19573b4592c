"""The engine's deadlines: one heap for every lifetime, each entry tagged with what it bounds.

An allocation, permission or channel (a *refreshable* kind) has one live entry at most, at or
before its expiry: a refresh that extends the expiry pushes nothing (`schedule` remembers the
entry's deadline per key), and when the entry comes due the engine checks it against the current
expiry and schedules it again if it was extended. So a client refreshing a permission in a loop
costs a dict lookup, not a heap entry per request (which would grow the heap without bound for
the lifetime). A refresh that shortens an expiry (an allocation's LIFETIME) pushes an earlier
entry and leaves the later one stale; `due()` skips stale entries. Entries of deleted
allocations are dropped by `compact()` once they dominate the heap.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Collection, Iterator
from typing import Any

from stunnerd.turn.effects import Address

COMPACT_MIN_ENTRIES = 1024
COMPACT_RATIO = 16


class DeadlineKind(enum.IntEnum):
    """What a deadline bounds; the heap entry's item is named after it."""

    ALLOCATION = 0  # item: None
    PERMISSION = 1  # item: the peer IP
    CHANNEL = 2  # item: the channel number
    RESERVATION = 3  # item: the reservation token (outlives the allocation that made it)
    TCP_CONNECTION = 4  # item: the RFC 6062 connection id (connect or bind timeout)


REFRESHABLE = frozenset({DeadlineKind.ALLOCATION, DeadlineKind.PERMISSION, DeadlineKind.CHANNEL})


class Deadlines:
    """A min-heap of (deadline, seq, kind, client, item); seq keeps equal deadlines ordered."""

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, DeadlineKind, Address, Any]] = []
        self._live: dict[tuple[DeadlineKind, Address, Any], float] = {}
        """The deadline of the one live entry of each refreshable (kind, client, item)."""
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def next(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def schedule(self, deadline: float, kind: DeadlineKind, client: Address, item: Any) -> None:
        """Be woken at `deadline`; for a refreshable kind, only if no live entry of the same
        (kind, client, item) comes earlier (its handler reschedules if need be)."""
        if kind in REFRESHABLE:
            key = (kind, client, item)
            live = self._live.get(key)
            if live is not None and live <= deadline:
                return
            self._live[key] = deadline
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, kind, client, item))

    def due(self, now: float) -> Iterator[tuple[DeadlineKind, Address, Any]]:
        """Pop and yield every live entry at or before `now`, earliest first."""
        heap = self._heap
        live = self._live
        while heap and heap[0][0] <= now:
            deadline, _, kind, client, item = heapq.heappop(heap)
            if kind in REFRESHABLE:
                key = (kind, client, item)
                if live.get(key) != deadline:
                    continue  # superseded by an earlier entry
                del live[key]
            yield kind, client, item

    def compact(self, live: Collection[Address], held: int) -> None:
        """Drop entries of allocations not in `live` once they dominate (heavy churn).

        `held` is the number of live reservations, whose entries are always kept.
        """
        heap = self._heap
        if len(heap) > COMPACT_MIN_ENTRIES and len(heap) > COMPACT_RATIO * (len(live) + held):
            # in place: a `due()` iteration may hold the list
            heap[:] = [e for e in heap if e[2] is DeadlineKind.RESERVATION or e[3] in live]
            heapq.heapify(heap)
            self._live = {key: at for key, at in self._live.items() if key[1] in live}

    def clear(self) -> None:
        self._heap.clear()
        self._live.clear()
