"""IPv6 addresses that carry an IPv4 address, and where in them it sits.

A relay sends to an IPv6 peer as IPv6, but a translator or tunnel on the path turns a datagram
to some IPv6 addresses into one to the IPv4 address they carry: a NAT64 gateway (RFC 6052,
RFC 8215), a 6to4 relay (RFC 3056), a Teredo relay (RFC 4380), an automatic tunnel for
IPv4-compatible addresses (RFC 4291 §2.5.5.1). The peer rules therefore judge such a peer by the
IPv4 address(es) it carries as well as by itself (`stunnerd.routing`, `stunnerd.protected`).

IPv4-mapped addresses (RFC 4291 §2.5.5.2) are not listed here: such a peer *is* an IPv4 peer,
judged, permitted and relayed as one (`stunnerd.turn.allocation.unmapped`).
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

_V6_BITS = 128


@dataclass(frozen=True, slots=True)
class Reading:
    """Where one IPv4 address sits in an IPv6 address: each octet's first bit, and a mask the
    stored bits were XORed with (Teredo's client address)."""

    octets: tuple[int, int, int, int]
    xor: int = 0

    def ipv4(self, value: int) -> IPv4Address:
        v4 = 0
        for offset in self.octets:
            v4 = (v4 << 8) | ((value >> (_V6_BITS - 8 - offset)) & 0xFF)
        return IPv4Address(v4 ^ self.xor)

    def within(self, net: IPv6Network, guard: IPv4Network) -> bool:
        """Does every address of `net` carry, in this place, an IPv4 address inside `guard`?

        So when `net` fixes each bit that `guard`'s prefix fixes (the octets' bits ascend
        through the IPv6 address, so the last of them decides) and those bits agree.
        """
        if guard.prefixlen == 0:
            return True
        last = guard.prefixlen - 1
        if self.octets[last // 8] + last % 8 >= net.prefixlen:
            return False
        return self.ipv4(int(net.network_address)) in guard


@dataclass(frozen=True, slots=True)
class Embedding:
    """An IPv6 range whose addresses carry IPv4 addresses, and where."""

    name: str
    prefix: IPv6Network
    readings: tuple[Reading, ...]
    named_only: bool = False
    """True where the place depends on a choice of the operator's that stunnerd cannot know
    (RFC 8215's local-use prefix): then only a route that names the range admits its peers."""

    def ipv4s(self, addr: IPv6Address) -> tuple[IPv4Address, ...]:
        value = int(addr)
        return tuple(reading.ipv4(value) for reading in self.readings)


_LAST_32 = Reading((96, 104, 112, 120))

EMBEDDINGS: tuple[Embedding, ...] = (
    Embedding("IPv4-compatible, RFC 4291 §2.5.5.1", IPv6Network("::/96"), (_LAST_32,)),
    Embedding("NAT64, RFC 6052", IPv6Network("64:ff9b::/96"), (_LAST_32,)),
    # RFC 6052 §2.2 for a /48 prefix: 16 bits at 48-63, the "u" octet (64-71), 16 bits at 72-87
    Embedding(
        "local-use NAT64, RFC 8215",
        IPv6Network("64:ff9b:1::/48"),
        (Reading((48, 56, 72, 80)),),
        named_only=True,
    ),
    Embedding("6to4, RFC 3056", IPv6Network("2002::/16"), (Reading((16, 24, 32, 40)),)),
    # RFC 4380 §4: the server's address in bits 32-63, the client's in 96-127 with every bit
    # inverted
    Embedding(
        "Teredo, RFC 4380",
        IPv6Network("2001::/32"),
        (Reading((32, 40, 48, 56)), Reading((96, 104, 112, 120), 0xFFFFFFFF)),
    ),
)

_NOT_EMBEDDED = (IPv6Address("::"), IPv6Address("::1"))
"""Inside ::/96 but IPv6 addresses in their own right (unspecified, loopback)."""


def embedding_of(ip: str) -> tuple[Embedding, tuple[IPv4Address, ...]] | None:
    """The embedding an IPv6 peer address falls in and the IPv4 address(es) it carries.

    None for an IPv4 address, an IPv4-mapped one, any other IPv6 address, or not an address.
    """
    if ":" not in ip:
        return None
    try:
        addr = IPv6Address(ip)
    except ValueError:
        return None
    if addr.ipv4_mapped is not None or addr in _NOT_EMBEDDED:
        return None
    for embedding in EMBEDDINGS:
        if addr in embedding.prefix:
            return embedding, embedding.ipv4s(addr)
    return None
