"""Peer endpoints of STATIC clusters: ``<ip>[/<prefix>][:<MIN-MAX>]``.

Endpoints decide which peers a TURN client may reach, so they are parsed once, kept as integers
and matched without allocating: `Endpoint.matches` runs for every permission check. The port range
uses literal angle brackets (``10.0.0.1:<10000-20000>``) and is split off first, which is what
lets an IPv6 address with its colons through. IPv4-mapped IPv6 peers (``::ffff:a.b.c.d``, as a
dual-stack socket reports them) match IPv4 prefixes, like Go's ``net.IPNet.Contains``.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from stunner_common.config.errors import ConfigValidationError

__all__ = [
    "CANONICAL_CACHE_SIZE",
    "ENDPOINT_CACHE_SIZE",
    "MAX_PORT",
    "Endpoint",
    "canonical_endpoint",
    "clear_endpoint_cache",
    "parse_endpoint",
]

MAX_PORT = 65535
ENDPOINT_CACHE_SIZE = 8192
"""Parsed endpoints kept (about 650 B each)."""
CANONICAL_CACHE_SIZE = 32768
"""Canonical forms kept (about 140 B each). Every render validates every endpoint of the configs
it renders again, in the same order each time, and a least-recently-used cache smaller than such a
cycle misses on every call (a miss costs about 50 µs, a hit 0.2 µs): this one holds three times
the 10,000 endpoints of a Gateway that `python -m bench control` churns."""
_RANGE_RE = re.compile(r"^(.*):<([0-9]+)-([0-9]+)>$", re.DOTALL)

IPAddress = IPv4Address | IPv6Address


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An address prefix plus an inclusive peer port range.

    `str()` gives the canonical form: the network address, ``/<prefix>`` unless it is a host
    prefix, and ``:<min-max>`` unless the range is the full 1-65535.
    """

    network: IPv4Network | IPv6Network
    port_min: int = 1
    port_max: int = MAX_PORT
    _version: int = field(init=False, repr=False, compare=False)
    _net: int = field(init=False, repr=False, compare=False)
    _mask: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_version", self.network.version)
        object.__setattr__(self, "_net", int(self.network.network_address))
        object.__setattr__(self, "_mask", int(self.network.netmask))

    def contains(self, ip: str | IPAddress) -> bool:
        """True if `ip` is inside the prefix; the port is not looked at."""
        addr = _as_address(ip)
        if addr is None or addr.version != self._version:
            return False
        return (int(addr) & self._mask) == self._net

    def matches(self, ip: str | IPAddress, port: int) -> bool:
        """True if `ip` is inside the prefix and `port` in the range; port 0 ignores the port."""
        if port and not (self.port_min <= port <= self.port_max):
            return False
        return self.contains(ip)

    def __str__(self) -> str:
        net = self.network
        text = str(net.network_address)
        if net.prefixlen != net.max_prefixlen:
            text = f"{text}/{net.prefixlen}"
        if (self.port_min, self.port_max) != (1, MAX_PORT):
            text = f"{text}:<{self.port_min}-{self.port_max}>"
        return text


def _as_address(ip: str | IPAddress) -> IPAddress | None:
    if isinstance(ip, str):
        try:
            ip = ipaddress.ip_address(ip)
        except ValueError:
            return None
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def parse_endpoint(text: str) -> Endpoint:
    """Parse ``ip[/prefix][:<lo-hi>]``; the prefix is masked to its network address.

    Raises `ConfigValidationError` for a missing or bad address, a bad prefix, or a port range
    outside 0-65535 or with MIN > MAX (upstream silently accepts the latter two, and such a range
    can never admit a peer, so it is almost certainly a typo). Results are cached: configs are
    re-validated on every change and mostly repeat the endpoints they had.
    """
    if not isinstance(text, str):
        raise ConfigValidationError("endpoint", text, f"invalid endpoint: {text!r}")
    return _parse_endpoint(text)


@functools.lru_cache(maxsize=ENDPOINT_CACHE_SIZE)
def _parse_endpoint(text: str) -> Endpoint:
    addr, port_min, port_max = text.strip(), 1, MAX_PORT
    found = _RANGE_RE.match(addr)
    if found is not None:
        addr = found.group(1)
        lo, hi = found.group(2), found.group(3)
        if len(lo) > 5 or len(hi) > 5 or int(lo) > MAX_PORT or int(hi) > MAX_PORT:
            raise ConfigValidationError(
                "endpoint", text, f'invalid endpoint "{text}": port out of range 0-{MAX_PORT}'
            )
        port_min, port_max = int(lo), int(hi)
        if port_min > port_max:
            raise ConfigValidationError(
                "endpoint", text, f'invalid endpoint "{text}": port range {lo}-{hi} is empty'
            )
    if not addr:
        raise ConfigValidationError("endpoint", text, f'invalid endpoint "{text}": no address')
    try:
        if "/" in addr:
            network: IPv4Network | IPv6Network = ipaddress.ip_network(addr, strict=False)
        else:
            network = ipaddress.ip_network(ipaddress.ip_address(addr))
    except ValueError:
        raise ConfigValidationError(
            "endpoint", text, f'invalid endpoint "{text}": not an IP address or prefix'
        ) from None
    return Endpoint(network, port_min, port_max)


@functools.lru_cache(maxsize=CANONICAL_CACHE_SIZE)
def canonical_endpoint(text: str) -> str:
    """The canonical string form of an endpoint; raises like `parse_endpoint`."""
    return str(parse_endpoint(text))


def clear_endpoint_cache() -> None:
    """Forget cached parses (for benchmarks that want to measure a cold start)."""
    _parse_endpoint.cache_clear()
    canonical_endpoint.cache_clear()
