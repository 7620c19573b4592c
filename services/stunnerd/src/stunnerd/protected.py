"""Peers a route must name explicitly: loopback, link-local, cloud metadata, stunnerd's own.

A TURN relay that reaches these on a client's behalf hands the client the server's own view of the
network (RFC 8656 §21.2: the metadata service at 169.254.169.254, services bound to loopback,
stunnerd's own health port). A broad route such as `0.0.0.0/0` or `10.0.0.0/8` must therefore
not admit them by accident. The rule:

* A peer inside a protected range is admitted only by a STATIC endpoint whose prefix lies *inside*
  the most specific protected range that contains the peer. `127.0.0.1/32` or `127.0.0.0/8`
  admit loopback peers, `0.0.0.0/0` does not; `169.254.0.0/16` admits link-local peers but not
  the metadata address, which only `169.254.169.254/32` admits.
* stunnerd's own addresses (its listener and bind addresses and what its host name resolves to,
  e.g. the pod IP) are each a range of one address, unless a standard range below already covers
  them: only an endpoint naming exactly that address admits it.
* A STRICT_DNS name admits a protected address only when it is a `localhost` name (RFC 6761
  §6.3: such names mean loopback, so naming one names loopback) and the address is loopback.
* IPv4-mapped IPv6 peers (`::ffff:127.0.0.1`) are judged as the IPv4 address they carry.
* Other IPv6 peers that carry an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible:
  `stunnerd.turn.embedded`) are judged by it as well: when it is protected, a route must name it
  as it would the IPv4 peer (`127.0.0.1/32`), or name an IPv6 prefix every address of which
  carries an address of that range (`64:ff9b::7f00:1/128`); `::/0` never does
  (`stunnerd.routing.RoutePeerPolicy`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

Network = IPv4Network | IPv6Network
Address = IPv4Address | IPv6Address

STANDARD_RANGES: tuple[tuple[str, str], ...] = (
    ("169.254.169.254/32", "cloud metadata"),
    ("fd00:ec2::254/128", "cloud metadata"),
    ("127.0.0.0/8", "loopback"),
    ("::1/128", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("fe80::/10", "link-local"),
    ("0.0.0.0/8", "this host"),
    ("::/128", "this host"),
)
LOOPBACK = (IPv4Network("127.0.0.0/8"), IPv6Network("::1/128"))


def normalize(ip: str) -> Address | None:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if isinstance(addr, IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def is_localhost_name(name: str) -> bool:
    name = name.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost") or name == "localhost.localdomain"


@dataclass(frozen=True, slots=True)
class ProtectedRanges:
    """The protected ranges of one stunnerd, most specific first."""

    ranges: tuple[tuple[Network, str], ...]

    @classmethod
    def build(cls, own_addresses: Iterable[str] = ()) -> ProtectedRanges:
        standard = [(ipaddress.ip_network(net), what) for net, what in STANDARD_RANGES]
        own: list[tuple[Network, str]] = []
        for ip in own_addresses:
            addr = normalize(ip)
            if addr is None or addr.is_unspecified:
                continue
            if any(addr in net for net, _ in standard):
                continue
            net = ipaddress.ip_network(addr)
            if all(net != known for known, _ in own):
                own.append((net, "stunnerd's own address"))
        everything = own + standard
        everything.sort(key=lambda item: -item[0].prefixlen)
        return cls(tuple(everything))

    def _range_of(self, ip: str) -> tuple[Network, str] | None:
        addr = normalize(ip)
        if addr is None:
            return None
        return next(
            (item for item in self.ranges if addr.version == item[0].version and addr in item[0]),
            None,
        )

    def guard_of(self, ip: str) -> Network | None:
        """The most specific protected range holding `ip`, or None for an ordinary peer."""
        found = self._range_of(ip)
        return found[0] if found is not None else None

    def describe(self, ip: str) -> str | None:
        """What the protected range holding `ip` is ("loopback", ...), or None."""
        found = self._range_of(ip)
        return found[1] if found is not None else None


def inside(prefix: Network, guard: Network) -> bool:
    """Does an endpoint prefix lie within a protected range (so that it names it explicitly)?"""
    return prefix.version == guard.version and prefix.subnet_of(guard)  # type: ignore[arg-type]


def dns_may_admit(name: str, ip: str) -> bool:
    addr = normalize(ip)
    return (
        addr is not None
        and is_localhost_name(name)
        and any(addr.version == net.version and addr in net for net in LOOPBACK)
    )
