"""Why a client was refused, in the log at INFO, rate-limited per source; counted by code.

A wrong password (401 after a credentialed request) or a peer no route admits (403) is the most
common support question ("permission denied ... no route to endpoint"), so each refusal is logged
with who (the user), from where (the client address), which request, which code and, for 403,
which peer and which routes were considered, whether the peer is in a protected range and which
IPv4 addresses an IPv6 peer carries (NAT64, 6to4, ...): enough to answer "why was I refused"
from the log alone. A source (client IP) gets its first refusal of each code logged in full (so
a 403 right after a 401 from the same host is still seen); later ones within the interval are
only counted, and the count is logged when the interval is over and the source is refused again,
or when any later refusal sweeps the ended intervals. So a client retrying in a loop, or a
scanner, costs one line per code and interval, not one per request.

Only the request path calls `refused` (a refusal is an answer to a STUN request); ChannelData
never does. `counts` (code -> refusals) feeds the `stunner_listener_refusals` metric.

`limits` counts refusals by the limit behind them (one of `LIMITS`, the rows of docs/limits.md),
whatever the answer was: a 401 without a check, a dropped message, a closed connection. The engine
counts those it decides (`limited`); the edge counts those of its connections and sessions on the
listener's engine's log. It feeds the `stunner_listener_limit_refusals` metric.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stunnerd.turn.allocation import unmapped
from stunnerd.turn.codec import Method, TcpMethod
from stunnerd.turn.effects import Address
from stunnerd.turn.embedded import embedding_of
from stunnerd.turn.policies import PeerPolicy

log = logging.getLogger("stunnerd.refusals")

LIMITS = (
    "message_bytes",
    "udp_datagram_bytes",
    "attributes",
    "challenge_rate",
    "auth_failures_source",
    "auth_failures_user",
    "connections_per_source",
    "handshake_timeout",
    "first_message_timeout",
    "preauth_trickle",
    "idle_timeout",
    "dtls_sessions",
    "user_quota",
    "permissions_per_allocation",
    "channels_per_allocation",
    "tcp_connections_per_allocation",
)
"""Every limit a refusal is counted by (the `limit` label of `stunner_listener_limit_refusals`)."""

INTERVAL_S = 60.0
MAX_SOURCES = 4096
"""Sources tracked at once; past it the oldest windows are summarised and dropped."""


@dataclass(slots=True)
class _Window:
    ends: float
    suppressed: Counter[int] = field(default_factory=Counter)


def _where(client: Address) -> str:
    host, port = client[0], client[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RefusalLog:
    """One listener's refusals: counted by code, logged per source at most once per interval."""

    __slots__ = (
        "_next_sweep",
        "_sources",
        "counts",
        "interval_s",
        "limits",
        "listener",
        "max_sources",
    )

    def __init__(
        self, listener: str = "", interval_s: float = INTERVAL_S, max_sources: int = MAX_SOURCES
    ) -> None:
        self.listener = listener
        self.interval_s = interval_s
        self.max_sources = max_sources
        self.counts: Counter[int] = Counter()
        self.limits: Counter[str] = Counter()
        self._sources: dict[tuple[str, int], _Window] = {}
        self._next_sweep = 0.0

    def refused(
        self,
        now: float,
        client: Address,
        method: str,
        code: int,
        reason: str,
        user: str = "",
        detail: str = "",
        limit: str = "",
    ) -> None:
        """An error answer `code`; `limit` names the limit behind it, if one is."""
        self.counts[code] += 1
        if limit:
            self.limits[limit] += 1
        ip = client[0]
        key = (ip, code)
        window = self._sources.get(key)
        if window is not None and now < window.ends:
            window.suppressed[code] += 1
            return
        if window is not None:
            self._summary(ip, self._sources.pop(key))
        if now >= self._next_sweep:
            self._sweep(now)
        if len(self._sources) >= self.max_sources:
            oldest = min(self._sources, key=lambda k: self._sources[k].ends)
            self._summary(oldest[0], self._sources.pop(oldest))
        self._sources[key] = _Window(now + self.interval_s)
        who = f" (user {user!r})" if user else ""
        more = f": {detail}" if detail else ""
        log.info(
            "listener %s: refused %s from %s%s: %d %s%s",
            self.listener,
            method,
            _where(client),
            who,
            code,
            reason,
            more,
        )

    def limited(self, limit: str, count: int = 1) -> None:
        """`count` refusals by `limit` (one of `LIMITS`) that are no error answer: messages
        dropped, connections closed or refused."""
        self.limits[limit] += count

    def limit_counts(self) -> tuple[tuple[str, int], ...]:
        """(limit, refusals) for every one of `LIMITS`, in that order, zeros included."""
        limits = self.limits
        return tuple((name, limits[name]) for name in LIMITS)

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + self.interval_s
        for key in [key for key, w in self._sources.items() if now >= w.ends]:
            self._summary(key[0], self._sources.pop(key))

    def _summary(self, ip: str, window: _Window) -> None:
        total = sum(window.suppressed.values())
        if not total:
            return
        codes = ", ".join(f"{n}x {code}" for code, n in sorted(window.suppressed.items()))
        log.info(
            "listener %s: refused %d more request(s) from %s in %.0f s (%s)",
            self.listener,
            total,
            ip,
            self.interval_s,
            codes,
        )


def method_name(method: int) -> str:
    """``ALLOCATE``, ``CREATE_PERMISSION``, ``CONNECT``, ... for a STUN method number."""
    for enum in (Method, TcpMethod):
        try:
            return str(enum(method).name)
        except ValueError:
            continue
    return f"method 0x{method:03x}"


def forbidden_detail(peers: PeerPolicy, requested: tuple[Address, ...]) -> str:
    """Which peer a 403 was about and which routes were considered (for the log)."""
    refused = [p for p in requested if not peers.admits(unmapped(p[0]), p[1])]
    shown = refused or list(requested)
    where = ", ".join(_where((unmapped(p[0]), p[1])) for p in shown)
    clusters = getattr(peers, "clusters", None)
    if clusters is None:
        routes = type(peers).__name__
    elif not clusters:
        routes = "none: the listener has no route"
    else:
        routes = "; ".join(
            f"{c.name} ({c.protocol}: "
            f"{', '.join([*map(str, c.endpoints), *c.dns_names]) or 'no endpoints'})"
            for c in clusters
        )
    guard = getattr(getattr(peers, "protected", None), "guard_of", None)
    ranges = sorted(
        {str(net) for ip, _ in shown if guard is not None and (net := guard(unmapped(ip)))}
    )
    protected = (
        f"; the peer is in protected range {', '.join(ranges)}: a route must name it exactly"
        if ranges
        else ""
    )
    ips = dict.fromkeys(unmapped(p[0]) for p in shown)
    carried = "".join(_carried_note(ip, guard) for ip in ips)
    peer = where or "none"
    return f"peer {peer} is admitted by no route (routes considered: {routes}){protected}{carried}"


def _carried_note(ip: str, guard: Any) -> str:
    """For an IPv6 peer that carries IPv4 addresses: which, and what a route must do about them."""
    embedded = embedding_of(ip)
    if embedded is None:
        return ""
    embedding, carried = embedded
    notes = []
    for ipv4 in dict.fromkeys(carried):
        net = guard(str(ipv4)) if guard is not None else None
        if net is not None:
            notes.append(
                f"; the peer carries {ipv4} ({embedding.name}), in protected range {net}: "
                "a route must name it exactly"
            )
        elif embedding.named_only:
            notes.append(
                f"; the peer carries {ipv4} ({embedding.name}): only a route naming "
                f"{embedding.prefix} or a prefix inside it admits it"
            )
        else:
            notes.append(
                f"; the peer carries {ipv4} ({embedding.name}): a route must admit that address "
                f"too, or name {embedding.prefix} or a prefix inside it"
            )
    return "".join(notes)
