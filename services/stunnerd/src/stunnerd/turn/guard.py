"""Limits on what a client may cost a listener: before its credentials are proven, and after.

`RequestLimits` bounds a STUN message before it is parsed (size, attribute count; see
`stunnerd.turn.precheck`) and the rate of challenges (401 and 438 answers) per source IP. The
challenge budget matters because a challenge is the one answer anyone gets, so a sender that
forges a victim's address could otherwise turn the server into a reflector; over budget, the
request is dropped silently (RFC 8489 lets a server ignore requests it will not serve).

Failed authentications are budgeted too (`FailedAuthBudget`), so that 401 is no unlimited
password-guessing oracle; and what one authenticated allocation may hold (permissions, channels)
is capped. Every per-source or per-user state here is a bounded least-recently-used table: a
flood from many addresses evicts old entries instead of growing memory. The bounds annotated on
each limit are what the settings accept (`STUNNERD_MAX_STUN_MESSAGE_BYTES`, ...); docs/limits.md
lists them all.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Protocol

from stunnerd.bounds import Ge, Interval

CHALLENGE_SOURCES_MAX = 16384
AUTH_FAILURE_KEYS_MAX = 16384
"""Sources, and users, whose failed authentications are remembered at once (LRU beyond)."""
MAX_PERMISSIONS_PER_ALLOCATION = 256
MAX_CHANNELS_PER_ALLOCATION = 256
IPV6_SOURCE_PREFIX = 64
"""An IPv6 client's failures count against its /64: one host usually holds the whole prefix."""


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
    auth_failure_rate_per_s: Annotated[float, Ge(0)] = 0.5
    """Failed authentications (wrong password, unknown or expired user) a source may make per
    second, on average (0: unlimited). Over it, its credentials are no longer checked: every
    request from it is answered 401 until the budget refills. IPv6 sources count per /64."""
    auth_failure_burst: Annotated[int, Ge(1)] = 30
    """Failed authentications a source may make at once before the rate applies."""
    user_auth_failure_rate_per_s: Annotated[float, Ge(0)] = 5.0
    """Failed authentications (wrong password) one username may see per second, from all sources
    together (0: unlimited). Over it, the username's credentials are checked only for sources
    with no failure on record: a guesser gets no verdict, a client that never failed still gets
    in (a shared static user is never locked out)."""
    user_auth_failure_burst: Annotated[int, Ge(1)] = 200
    """Failed authentications one username may see at once before its rate applies."""
    max_permissions_per_allocation: Annotated[int, Ge(1)] = MAX_PERMISSIONS_PER_ALLOCATION
    """Peer IPs one allocation may hold permissions for; a CreatePermission or ChannelBind that
    would install more gets 508 (RFC 8656 §9.2, §11.2) and installs nothing."""
    max_channels_per_allocation: Annotated[int, Ge(1)] = MAX_CHANNELS_PER_ALLOCATION
    """Channels one allocation may bind (RFC 8656 §12 allows 4096); past it ChannelBind gets 508."""


class SourceBudget(Protocol):
    """Challenges per source IP: a `ChallengeBudget`, or the C relay's buckets of a listener
    whose first challenges C answers (`stunnerd.fastpath.ListenerBudget`)."""

    def allow(self, ip: str, now: float) -> bool:
        """Spend one challenge for `ip` at `now`; False when its bucket is empty."""
        ...


class ChallengeBudget:
    """A token bucket per source IP (or any key), in a table of at most `max_sources` entries
    (LRU)."""

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

    def spent(self, key: str, now: float) -> float:
        """Tokens `key` has spent and not yet regained at `now` (0: full, or never seen)."""
        entry = self._buckets.get(key)
        if entry is None or self.rate_per_s <= 0:
            return 0.0
        return max(0.0, self.burst - (entry[0] + (now - entry[1]) * self.rate_per_s))

    def exhausted(self, key: str, now: float) -> bool:
        """Whether `key` has less than one token at `now` (never, when the rate is 0)."""
        return self.spent(key, now) > self.burst - 1.0


def failure_source(ip: str) -> str:
    """The key a client's failed authentications count against: its IPv4 address (an
    IPv4-mapped IPv6 one unmapped), or the /64 of its IPv6 address."""
    if ":" not in ip:
        return ip
    addr = ipaddress.IPv6Address(ip.partition("%")[0])
    if addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(ipaddress.IPv6Network((addr, IPV6_SOURCE_PREFIX), strict=False))


class FailedAuthBudget:
    """Failed authentications per source and per username (RFC 8489 §9.2.4 leaves this to us).

    A request whose credentials fail spends a token from its source's bucket and, when the user
    exists (a wrong password), from the username's. Before credentials are checked, `refuses`
    says whether to skip the check and answer 401: when the source's bucket is empty, or when the
    username's is and the source has failed recently itself. So a guesser from one address gets
    `auth_failure_burst` verdicts and then `auth_failure_rate_per_s`; guessers spread over many
    addresses get one verdict per address per refill once the user's budget is spent; and a
    client that has not failed is always checked, so an attack on a shared username locks no
    honest client out.
    """

    __slots__ = ("sources", "suppressed", "users")

    def __init__(self, limits: RequestLimits, max_keys: int = AUTH_FAILURE_KEYS_MAX) -> None:
        self.sources = ChallengeBudget(
            limits.auth_failure_rate_per_s, limits.auth_failure_burst, max_keys
        )
        self.users = ChallengeBudget(
            limits.user_auth_failure_rate_per_s, limits.user_auth_failure_burst, max_keys
        )
        self.suppressed: dict[str, int] = {"source": 0, "user": 0}
        """Requests answered 401 without a check, by the budget that was spent."""

    def refuses(self, ip: str, username: str, now: float) -> str:
        """'source' or 'user': the spent budget that refuses a check; '' to check."""
        source = failure_source(ip)
        if self.sources.exhausted(source, now):
            self.suppressed["source"] += 1
            return "source"
        if self.users.exhausted(username, now) and self.sources.spent(source, now) > 0:
            self.suppressed["user"] += 1
            return "user"
        return ""

    def failed(self, ip: str, username: str | None, now: float) -> None:
        """A check failed; `username` is None when no such user exists (only the source pays)."""
        self.sources.allow(failure_source(ip), now)
        if username is not None:
            self.users.allow(username, now)
