"""Limits on what a client without credentials may cost a listener, and the per-source 401 budget.

`RequestLimits` bounds a STUN message before it is parsed (size, attribute count; see
`stunnerd.turn.precheck`) and the rate of challenges (401 and 438 answers) per source IP. The
challenge budget matters because a challenge is the one answer anyone gets, so a sender that
forges a victim's address could otherwise turn the server into a reflector; over budget, the
request is dropped silently (RFC 8489 lets a server ignore requests it will not serve). The
per-source state is a bounded least-recently-used table: a flood from many addresses evicts old
entries instead of growing memory. The bounds annotated on each limit are what the settings
accept (`STUNNERD_MAX_STUN_MESSAGE_BYTES`, ...).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Interval

CHALLENGE_SOURCES_MAX = 16384


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_message_bytes: Annotated[int, Interval(ge=548, le=65555)] = 1500
    """A STUN message larger than this is dropped unread (ChannelData is not limited)."""
    max_attributes: Annotated[int, Ge(8)] = 40
    """A request with more attributes is answered 400 without decoding any."""
    challenge_rate_per_s: Annotated[float, Ge(0)] = 100.0
    """401/438 answers per source IP and second, on average (0: unlimited); over it, requests
    are dropped."""
    challenge_burst: Annotated[int, Ge(1)] = 200
    """401/438 answers a source IP may get at once before the rate applies."""
    max_udp_datagram_bytes: Annotated[int, Interval(ge=1500, le=65536)] = 9216
    """A TURN-UDP listener reads at most this much of a datagram (default: a jumbo frame's
    payload); a longer one (ChannelData included) is dropped. The C relay reads only this much,
    so a flood of 60 KB datagrams costs a copy of this size each, not of 60 KB."""


class ChallengeBudget:
    """A token bucket per source IP, in a table of at most `max_sources` entries (LRU)."""

    __slots__ = ("_buckets", "burst", "max_sources", "rate_per_s")

    def __init__(
        self, rate_per_s: float, burst: int, max_sources: int = CHALLENGE_SOURCES_MAX
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self.max_sources = max_sources
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # ip -> (tokens, at)

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, ip: str, now: float) -> bool:
        """Spend one challenge for `ip` at `now`; False when its bucket is empty."""
        if self.rate_per_s <= 0:
            return True
        buckets = self._buckets
        entry = buckets.pop(ip, None)
        if entry is None:
            tokens = float(self.burst)
            if len(buckets) >= self.max_sources:
                buckets.popitem(last=False)
        else:
            tokens = min(float(self.burst), entry[0] + (now - entry[1]) * self.rate_per_s)
        allowed = tokens >= 1.0
        buckets[ip] = (tokens - 1.0 if allowed else tokens, now)
        return allowed
