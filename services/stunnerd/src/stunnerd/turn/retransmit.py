"""Answers remembered per (client, transaction id), so a retransmitted request gets the same bytes.

RFC 8489 §6.3.1: a server must answer a retransmission of a request it already processed with the
same response, which matters for requests that are not idempotent (a Refresh that deleted the
allocation, an Allocate that took a port). Entries live `RETRANSMIT_CACHE_S` (the RFC's 40 s); the
dict keeps insertion order, so expiry is a scan from the front and the oldest entry goes first
when the cache is full.
"""

from __future__ import annotations

from stunnerd.turn.effects import Address

RETRANSMIT_CACHE_S = 40.0
RETRANSMIT_CACHE_MAX = 8192


class RetransmitCache:
    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[Address, bytes], tuple[float, bytes]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, client: Address, transaction_id: bytes, now: float) -> bytes | None:
        cached = self._entries.get((client, transaction_id))
        if cached is not None and cached[0] > now:
            return cached[1]
        return None

    def remember(self, client: Address, transaction_id: bytes, answer: bytes, now: float) -> None:
        self.purge(now)
        entries = self._entries
        if len(entries) >= RETRANSMIT_CACHE_MAX:
            entries.pop(next(iter(entries)))
        entries[(client, transaction_id)] = (now + RETRANSMIT_CACHE_S, answer)

    def purge(self, now: float) -> None:
        entries = self._entries
        while entries:
            key = next(iter(entries))
            if entries[key][0] > now:
                break
            del entries[key]
