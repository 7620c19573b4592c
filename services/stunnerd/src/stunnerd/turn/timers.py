"""The engine's deadlines: one heap for every lifetime, each entry tagged with what it bounds.

Refreshing an allocation, permission or channel pushes a new entry and leaves the old one in the
heap; `due()` hands back every entry whose time has come and the engine checks it against the
current expiry, so a stale entry is skipped. That keeps a refresh at O(log n) with no search.
Entries of deleted allocations are dropped by `compact()` once they dominate the heap.
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


class Deadlines:
    """A min-heap of (deadline, seq, kind, client, item); seq keeps equal deadlines ordered."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, DeadlineKind, Address, Any]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def next(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def schedule(self, deadline: float, kind: DeadlineKind, client: Address, item: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, kind, client, item))

    def due(self, now: float) -> Iterator[tuple[DeadlineKind, Address, Any]]:
        """Pop and yield every entry at or before `now`, earliest first."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, kind, client, item = heapq.heappop(heap)
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

    def clear(self) -> None:
        self._heap.clear()
