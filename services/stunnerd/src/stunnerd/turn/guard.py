"""Limits on what a client without credentials may cost a listener, and the per-source 401 budget.

`RequestLimits` bounds a STUN message before it is parsed (size, attribute count; see
`stunnerd.turn.precheck`) and the rate of challenges (401 and 438 answers) per source IP. The
challenge budget matters because a challenge is the one answer anyone gets, so a sender that
forges a victim's address could otherwise turn the server into a reflector; over budget, the
request is dropped silently (RFC 8489 lets a server ignore requests it will not serve). The
per-source state is a bounded least-recently-used table: a flood from many addresses evicts old
entries instead of growing memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_MAX_MESSAGE_BYTES = 1500
DEFAULT_MAX_UDP_DATAGRAM_BYTES = 9216  # a jumbo frame's payload
DEFAULT_MAX_ATTRIBUTES = 40
DEFAULT_CHALLENGE_RATE_PER_S = 100.0
DEFAULT_CHALLENGE_BURST = 200
CHALLENGE_SOURCES_MAX = 16384


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """A STUN message larger than this is dropped unread (ChannelData is not limited)."""
    max_attributes: int = DEFAULT_MAX_ATTRIBUTES
    """A request with more attributes is answered 400 without decoding any."""
    challenge_rate_per_s: float = DEFAULT_CHALLENGE_RATE_PER_S
    """401/438 answers per source IP and second, on average (0: unlimited)."""
    challenge_burst: int = DEFAULT_CHALLENGE_BURST
    """401/438 answers a source IP may get at once before the rate applies."""
    max_udp_datagram_bytes: int = DEFAULT_MAX_UDP_DATAGRAM_BYTES
    """A TURN-UDP listener reads at most this much of a datagram; a longer one (ChannelData
    included) is dropped. The C relay reads only this much, so a flood of 60 KB datagrams
    costs a copy of this size each, not of 60 KB."""


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
