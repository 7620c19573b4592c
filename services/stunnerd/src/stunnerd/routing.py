"""Turn a validated `StunnerConfig` into the immutable policies a listener's engine consults.

This is the single place where config objects (pydantic, from `stunner_common.config`) become the
small frozen values of `stunnerd.turn.policies`. Peer admission follows upstream's routes →
clusters → endpoints chain (https://github.com/l7mp/stunner/blob/main/docs/GATEWAY.md): a
listener's routes name clusters; STATIC clusters hold
prefixes with optional port ranges, STRICT_DNS clusters hold names whose resolved addresses live in
a shared `DnsCache` that the edge refreshes. UDP relays use UDP clusters for data; permissions
accept an IP that any routed cluster (UDP or TCP) contains, port ignored, as upstream does.
Protected peers need a route that names them (`stunnerd.protected`), and an IPv6 peer that
carries an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible: `stunnerd.turn.embedded`) is
judged by that address too (`RoutePeerPolicy`).

What the edge derives from a config lives here too: the protected ranges with stunnerd's own
addresses (`protected_for`), the terms of the cluster-wide user quota (`quota_terms`), the
STRICT_DNS names to keep resolved (`dns_names`) and one round of resolving them (`resolve`);
`stunnerd.net.server.TurnServer` runs the rounds and swaps the policies.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Network

from stunner_common.config import (
    ClusterConfig,
    ConfigError,
    Endpoint,
    ListenerConfig,
    StunnerConfig,
    parse_endpoint,
)
from stunnerd.protected import Network, ProtectedRanges, dns_may_admit, inside
from stunnerd.turn.embedded import Embedding, Reading, embedding_of
from stunnerd.turn.engine import Policies
from stunnerd.turn.policies import (
    Authenticator,
    EphemeralAuthenticator,
    NoAuthenticator,
    StaticAuthenticator,
    UserQuota,
)

log = logging.getLogger(__name__)

_CACHE_MAX = 4096


class DnsCache:
    """Resolved addresses per STRICT_DNS name, shared by every policy; the edge fills it."""

    __slots__ = ("addresses", "version")

    def __init__(self) -> None:
        self.addresses: dict[str, frozenset[str]] = {}
        self.version = 0

    def names(self) -> set[str]:
        return set(self.addresses)

    def update(self, name: str, ips: Iterable[str]) -> bool:
        """Store a lookup result; True when it changed what the name admits."""
        new = frozenset(ips)
        if self.addresses.get(name) == new:
            return False
        self.addresses[name] = new
        self.version += 1
        return True

    def keep_only(self, names: set[str]) -> None:
        """Forget the names a config no longer mentions."""
        for stale in set(self.addresses) - names:
            del self.addresses[stale]
            self.version += 1


@dataclass(frozen=True, slots=True)
class ClusterMatcher:
    name: str
    protocol: str  # "UDP" or "TCP"
    endpoints: tuple[Endpoint, ...] = ()
    dns_names: tuple[str, ...] = ()
    dns: DnsCache | None = None

    def contains(self, ip: str, guard: Network | None = None) -> bool:
        """Does the cluster hold `ip`? Inside a protected range (`guard`), only explicitly."""
        if guard is None:
            if any(ep.contains(ip) for ep in self.endpoints):
                return True
            dns = self.dns
            return dns is not None and any(ip in dns.addresses.get(n, ()) for n in self.dns_names)
        if any(ep.contains(ip) and inside(ep.network, guard) for ep in self.endpoints):
            return True
        return self._dns_admits_protected(ip)

    def matches(self, ip: str, port: int, guard: Network | None = None) -> bool:
        if guard is None:
            if any(ep.matches(ip, port) for ep in self.endpoints):
                return True
            dns = self.dns
            return dns is not None and any(ip in dns.addresses.get(n, ()) for n in self.dns_names)
        if any(ep.matches(ip, port) and inside(ep.network, guard) for ep in self.endpoints):
            return True
        return self._dns_admits_protected(ip)

    def _dns_admits_protected(self, ip: str) -> bool:
        dns = self.dns
        return dns is not None and any(
            ip in dns.addresses.get(n, ()) and dns_may_admit(n, ip) for n in self.dns_names
        )

    def names(
        self,
        ip: str,
        port: int,
        embedding: Embedding,
        reading: Reading,
        carried: IPv4Address,
        guard: IPv4Network | None,
    ) -> bool:
        """Does the cluster name the embedded peer `ip` explicitly (port < 0: IP only)?

        A STATIC endpoint that holds `ip` and lies inside the embedding's range (`64:ff9b::/96`
        or narrower, not `::/0`) names it. When the IPv4 address it carries there is protected
        (`guard`), the endpoint must also lie inside that range's image: every address of it
        carries an IPv4 address inside `guard` (`64:ff9b::7f00:1/128` names the loopback peer
        `64:ff9b::7f00:1`, `64:ff9b::/96` does not). A STRICT_DNS name resolving to `ip` names
        it (DNS64 answers are such addresses), a protected one only as for IPv4 (a `localhost`
        name, loopback).
        """
        for ep in self.endpoints:
            net = ep.network
            if (
                isinstance(net, IPv6Network)
                and net.subnet_of(embedding.prefix)
                and (ep.contains(ip) if port < 0 else ep.matches(ip, port))
                and (guard is None or reading.within(net, guard))
            ):
                return True
        dns = self.dns
        return dns is not None and any(
            ip in dns.addresses.get(n, ()) and (guard is None or dns_may_admit(n, str(carried)))
            for n in self.dns_names
        )


@dataclass(frozen=True, slots=True)
class RoutePeerPolicy:
    """Admission for one listener: any routed UDP cluster matching (ip, port) admits data.

    An IPv6 peer that carries an IPv4 address (`stunnerd.turn.embedded`) must be admitted as an
    IPv6 peer *and*, for each IPv4 address it carries, either that address must be admitted as
    an IPv4 peer would be (same port, protected ranges included), or a route must name the IPv6
    range explicitly (`ClusterMatcher.names`). So `0.0.0.0/0` plus `::/0` admits
    `64:ff9b::c000:221` (192.0.2.33) but not `64:ff9b::7f00:1` (loopback), and `::/0` alone
    admits neither. RFC 8215's local-use range is admitted only where a route names it: where
    its IPv4 address sits depends on the prefix length its operator chose.

    Answers are memoised (the packet slow path asks per datagram); a DNS refresh bumps the cache
    version, which invalidates the memo.
    """

    clusters: tuple[ClusterMatcher, ...]
    dns: DnsCache | None = None
    protected: ProtectedRanges = field(default_factory=ProtectedRanges.build)
    """Peers a route must name explicitly (`stunnerd.protected`)."""
    _memo: dict[tuple[str, int], bool] = field(default_factory=dict, compare=False, repr=False)
    _memo_version: list[int] = field(default_factory=lambda: [0], compare=False, repr=False)
    _cluster_memo: dict[tuple[str, int], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def _check_version(self) -> None:
        if self.dns is not None and self.dns.version != self._memo_version[0]:
            self._memo.clear()
            self._cluster_memo.clear()
            self._memo_version[0] = self.dns.version

    def admits_ip(self, ip: str) -> bool:
        self._check_version()
        key = (ip, -1)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._admitting(ip, -1) is not None
            self._remember(key, hit)
        return hit

    def admits(self, ip: str, port: int) -> bool:
        self._check_version()
        key = (ip, port)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._admitting(ip, port) is not None
            self._remember(key, hit)
        return hit

    def cluster_of(self, ip: str, port: int) -> str | None:
        """The first routed UDP cluster that admits (ip, port): whose counters its traffic feeds.

        Asked when a channel route is installed, and per datagram on the indication path, hence
        memoised like `admits`.
        """
        self._check_version()
        key = (ip, port)
        memo = self._cluster_memo
        if key in memo:
            return memo[key]
        found = self._admitting(ip, port)
        name = found.name if found is not None else None
        if len(memo) >= _CACHE_MAX:
            memo.clear()
        memo[key] = name
        return name

    def _candidates(self, port: int) -> Iterable[ClusterMatcher]:
        """Port < 0 asks about an IP (a permission: any cluster), otherwise about a transport
        address (data: UDP clusters)."""
        if port < 0:
            return self.clusters
        return (c for c in self.clusters if c.protocol == "UDP")

    def _first(self, ip: str, port: int) -> ClusterMatcher | None:
        guard = self.protected.guard_of(ip)
        if port < 0:
            return next((c for c in self.clusters if c.contains(ip, guard)), None)
        return next((c for c in self._candidates(port) if c.matches(ip, port, guard)), None)

    def _admitting(self, ip: str, port: int) -> ClusterMatcher | None:
        """The first routed cluster that admits the peer, embedded IPv4 addresses judged."""
        found = self._first(ip, port)
        if found is None:
            return None
        embedded = embedding_of(ip)
        if embedded is None:
            return found
        embedding, carried = embedded
        for reading, ipv4 in zip(embedding.readings, carried, strict=True):
            if not self._carried_admitted(ip, port, embedding, reading, ipv4):
                return None
        return found

    def _carried_admitted(
        self, ip: str, port: int, embedding: Embedding, reading: Reading, ipv4: IPv4Address
    ) -> bool:
        guard = self.protected.guard_of(str(ipv4))
        guard4 = guard if isinstance(guard, IPv4Network) else None
        if any(c.names(ip, port, embedding, reading, ipv4, guard4) for c in self._candidates(port)):
            return True
        return not embedding.named_only and self._first(str(ipv4), port) is not None

    def _remember(self, key: tuple[str, int], value: bool) -> None:
        if len(self._memo) >= _CACHE_MAX:
            self._memo.clear()
        self._memo[key] = value


def authenticator_for(config: StunnerConfig) -> Authenticator:
    auth = config.auth
    creds = auth.credentials
    if auth.type == "static":
        return StaticAuthenticator(auth.realm, creds["username"], creds["password"])
    if auth.type == "ephemeral":
        return EphemeralAuthenticator(auth.realm, creds["secret"])
    return NoAuthenticator(auth.realm)


def cluster_matcher(cluster: ClusterConfig, dns: DnsCache | None) -> ClusterMatcher:
    if cluster.type == "STATIC":
        try:
            endpoints = tuple(parse_endpoint(e) for e in cluster.endpoints)
        except ConfigError as exc:
            raise ConfigError(f"cluster {cluster.name!r}: {exc}") from exc
        return ClusterMatcher(cluster.name, cluster.protocol, endpoints)
    names = tuple(e.lower().rstrip(".") for e in cluster.endpoints)
    return ClusterMatcher(cluster.name, cluster.protocol, (), names, dns)


def policies_for(
    listener: ListenerConfig,
    config: StunnerConfig,
    dns: DnsCache | None = None,
    protected: ProtectedRanges | None = None,
) -> Policies:
    """`protected`: the ranges a route must name explicitly (default: the standard ones)."""
    by_name: Mapping[str, ClusterConfig] = {c.name: c for c in config.clusters}
    matchers = tuple(
        cluster_matcher(by_name[route], dns) for route in listener.routes if route in by_name
    )
    return Policies(
        authenticator_for(config),
        RoutePeerPolicy(matchers, dns, protected or ProtectedRanges.build()),
        UserQuota(max(0, config.admin.user_quota)),
    )


def dns_names(config: StunnerConfig) -> set[str]:
    """Every STRICT_DNS name the config mentions (the edge keeps these resolved)."""
    return {
        e.lower().rstrip(".")
        for c in config.clusters
        if c.type == "STRICT_DNS"
        for e in c.endpoints
    }


def protected_for(
    config: StunnerConfig,
    *,
    host_addresses: Iterable[str],
    bind_host: str,
    node_address: str = "",
    relay_addresses: Iterable[str] = (),
) -> ProtectedRanges:
    """Peer ranges a route must name explicitly (`stunnerd.protected`), with stunnerd's own
    addresses: what its host name resolves to, its bind address, its listeners' addresses, the
    node's address (when set) and its extra relay addresses."""
    own = set(host_addresses)
    own.add(bind_host)
    own.update(lst.address for lst in config.listeners)
    if node_address:
        own.add(node_address)
    own.update(relay_addresses)
    return ProtectedRanges.build(own)


@dataclass(frozen=True, slots=True)
class QuotaTerms:
    """What the cluster-wide user quota counts under: the Gateway (`admin.name`), the realm,
    and the allocations one user may hold (`admin.user_quota`; 0: no limit)."""

    scope: str
    realm: str
    limit: int


def quota_terms(config: StunnerConfig) -> QuotaTerms:
    return QuotaTerms(config.admin.name, config.auth.realm, config.admin.user_quota)


async def resolve(dns: DnsCache, names: Iterable[str], timeout_s: float) -> bool:
    """One round of resolving `names` into `dns`; a name that does not resolve within
    `timeout_s` keeps its previous answer. True when an answer changed what a name admits."""
    loop = asyncio.get_running_loop()
    changed = False
    for name in names:
        try:
            async with asyncio.timeout(timeout_s):
                infos = await loop.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
        except (OSError, TimeoutError) as exc:
            log.debug("dns: cannot resolve %s: %s (keeping previous answer)", name, exc)
            continue
        changed |= dns.update(name, {str(info[4][0]) for info in infos})
    return changed
