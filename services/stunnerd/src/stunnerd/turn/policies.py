"""The decisions the engine delegates: who may authenticate, which peers are reachable, quotas.

Policies are small immutable objects injected into each `TurnEngine`; a config change builds new
ones and swaps them in (`TurnEngine.set_policies`) without touching live allocations. The config →
policy conversion lives outside this package (`stunnerd.routing`), so this module stays free of
pydantic and of any I/O. Credentials (the long-term key, TURN REST usernames and passwords) are
`stunner_common.auth`'s, the one rule every part of the system shares. Nonces are minted here
too: an opaque, verifiable, time-limited token (RFC 8489 §9.2) keyed by a secret the edge draws
once per engine.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from stunner_common.auth import ephemeral_password, long_term_key, parse_ephemeral_username

NONCE_LIFETIME_S = 3600.0
_CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Credential:
    user_id: str
    key: bytes
    username: str = ""  # the USERNAME it was found by (TURN REST: expiry:user_id)


class Authenticator(Protocol):
    """Maps a USERNAME to the integrity key, or None to refuse. `None` policy = TURN disabled."""

    @property
    def realm(self) -> str: ...

    @property
    def enabled(self) -> bool: ...

    def lookup(self, username: str, unix_now: float) -> Credential | None: ...


@dataclass(frozen=True, slots=True)
class StaticAuthenticator:
    realm: str
    username: str
    password: str
    enabled: bool = True
    _credential: Credential = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = long_term_key(self.username, self.realm, self.password)
        object.__setattr__(self, "_credential", Credential(self.username, key, self.username))

    def lookup(self, username: str, unix_now: float) -> Credential | None:
        if username != self.username:
            return None
        return self._credential


@dataclass(frozen=True, slots=True)
class EphemeralAuthenticator:
    realm: str
    secret: str
    enabled: bool = True

    def password(self, username: str) -> str:
        return ephemeral_password(self.secret, username)

    _keys: dict[str, tuple[int, Credential]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def lookup(self, username: str, unix_now: float) -> Credential | None:
        cached = self._keys.get(username)  # every request of a session repeats the derivation
        if cached is None:
            parsed = parse_ephemeral_username(username)
            if parsed is None:
                return None
            expiry, user_id = parsed
            key = long_term_key(username, self.realm, self.password(username))
            cached = (expiry, Credential(user_id, key, username))
            if len(self._keys) >= _CACHE_MAX:
                self._keys.clear()
            self._keys[username] = cached
        if cached[0] < int(unix_now):
            return None
        return cached[1]


@dataclass(frozen=True, slots=True)
class NoAuthenticator:
    """Auth type `none`: STUN Binding only, every TURN method is refused (upstream behaviour)."""

    realm: str = "stunner.l7mp.io"
    enabled: bool = False

    def lookup(self, username: str, unix_now: float) -> Credential | None:
        return None


class PeerPolicy(Protocol):
    """Peer admission (routes → clusters → endpoints) for one listener."""

    def admits_ip(self, ip: str) -> bool:
        """May a permission or channel be installed for this IP (port ignored)?"""
        ...

    def admits(self, ip: str, port: int) -> bool:
        """May a datagram flow to or from this transport address?"""
        ...

    def cluster_of(self, ip: str, port: int) -> str | None:
        """The name of the cluster that admits this transport address, for traffic counters."""
        ...


@dataclass(frozen=True, slots=True)
class AllowAllPeers:
    def admits_ip(self, ip: str) -> bool:
        return True

    def admits(self, ip: str, port: int) -> bool:
        return True

    def cluster_of(self, ip: str, port: int) -> str | None:
        return None


@dataclass(frozen=True, slots=True)
class PredicatePeerPolicy:
    """Admission from two predicates; handy for tests and for the config-built policy."""

    ip_predicate: Callable[[str], bool]
    addr_predicate: Callable[[str, int], bool]

    def admits_ip(self, ip: str) -> bool:
        return self.ip_predicate(ip)

    def admits(self, ip: str, port: int) -> bool:
        return self.addr_predicate(ip, port)

    def cluster_of(self, ip: str, port: int) -> str | None:
        return None


@dataclass(frozen=True, slots=True)
class UserQuota:
    """`admin.user_quota`: at most `limit` live allocations per user id (0 = unlimited)."""

    limit: int = 0

    def allows(self, user_id: str, usage: Mapping[str, int]) -> bool:
        return self.limit <= 0 or usage.get(user_id, 0) < self.limit

    @property
    def refusal(self) -> str:
        """The limit a refusal of this policy is counted by (`stunnerd.turn.refusals.LIMITS`)."""
        return "user_quota"


@dataclass(frozen=True, slots=True)
class Policies:
    """What one listener's engine is told to enforce; swapped whole by `TurnEngine.set_policies`."""

    authenticator: Authenticator
    peers: PeerPolicy
    quota: UserQuota


class UserUsage:
    """Live allocation counts per user id, shared by every listener of the process."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, user_id: str) -> None:
        self.counts[user_id] = self.counts.get(user_id, 0) + 1

    def remove(self, user_id: str) -> None:
        left = self.counts.get(user_id, 0) - 1
        if left > 0:
            self.counts[user_id] = left
        else:
            self.counts.pop(user_id, None)


NONCE_LENGTH = 24
"""Characters in a nonce: kept short because every 401 carries one (no answer to a request
without credentials may be larger than coturn's)."""


class NonceMint:
    """Nonces = base64url(issue time in ms, 6 bytes + HMAC-SHA256 truncated to 12 bytes).

    Valid for `lifetime_s`, never from the future; 24 characters.
    """

    __slots__ = ("_secret", "_verified", "lifetime_s")

    def __init__(self, secret: bytes, lifetime_s: float = NONCE_LIFETIME_S) -> None:
        if len(secret) < 16:
            raise ValueError("nonce secret must be at least 16 bytes")
        self._secret = secret
        self.lifetime_s = lifetime_s
        self._verified: dict[bytes, float] = {}  # nonce -> issue time, once its MAC checked out

    def _mac(self, stamp: bytes) -> bytes:
        return hmac.digest(self._secret, stamp, "sha256")[:12]

    def issue(self, now: float) -> bytes:
        stamp = max(0, int(now * 1000)).to_bytes(6, "big")
        return base64.urlsafe_b64encode(stamp + self._mac(stamp))

    def valid(self, nonce: bytes, now: float) -> bool:
        issued = self._verified.get(nonce)
        if issued is None:
            if len(nonce) != NONCE_LENGTH:
                return False
            try:
                raw = base64.urlsafe_b64decode(nonce)
            except ValueError:
                return False
            if len(raw) != 18 or not hmac.compare_digest(self._mac(raw[:6]), raw[6:]):
                return False
            issued = int.from_bytes(raw[:6], "big") / 1000
            if len(self._verified) >= _CACHE_MAX:
                self._verified.clear()
            self._verified[nonce] = issued
        return issued <= now + 1.0 and now - issued < self.lifetime_s
