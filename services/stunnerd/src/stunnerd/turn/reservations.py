"""Relay ports held for a later Allocate (EVEN-PORT with the R bit, RFC 8656 §7.2 and §14.9).

The engine asks the edge to bind two ports; the second is held under an opaque 8-byte
RESERVATION-TOKEN for `RESERVATION_LIFETIME_S`. A later Allocate that presents the token takes the
held port; an unclaimed port is released when its deadline passes or the listener closes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator

RESERVATION_LIFETIME_S = 30.0


class Reservations:
    """Held ports by token; tokens are an HMAC of a counter under the engine's secret."""

    __slots__ = ("_key", "_seq", "held")

    def __init__(self, secret: bytes) -> None:
        self._key = secret
        self._seq = 0
        self.held: dict[bytes, tuple[int, float]] = {}  # token -> (port, expiry)

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, port: int, now: float) -> tuple[bytes, float]:
        """Hold `port`; returns the token and the time the hold ends."""
        self._seq += 1
        token = hmac.new(self._key, self._seq.to_bytes(8, "big"), hashlib.sha256).digest()[:8]
        expires = now + RESERVATION_LIFETIME_S
        self.held[token] = (port, expires)
        return token, expires

    def valid(self, token: bytes, now: float) -> bool:
        held = self.held.get(token)
        return held is not None and held[1] > now

    def claim(self, token: bytes) -> int:
        """Take the held port (the caller checked `valid`)."""
        return self.held.pop(token)[0]

    def expire(self, token: bytes, now: float) -> int | None:
        """The port to release if the hold under `token` has ended, else None."""
        held = self.held.get(token)
        if held is not None and held[1] <= now:
            del self.held[token]
            return held[0]
        return None

    def release_all(self) -> Iterator[int]:
        ports = [port for port, _expires in self.held.values()]
        self.held.clear()
        return iter(ports)
