"""What an allocation holds: its relay, permissions and channels, and the lifetimes that bound them.

Plain slotted classes (not dataclasses) because the engine mutates them on every refresh and the
edge reads `Channel.peer` when it installs a ChannelData route. The lifetimes are RFC 8656's
defaults; `lifetime()` is the §7.2 rule for a requested LIFETIME. Which state an allocation is
in, and how it moves between them, is `stunnerd.turn.table`'s business.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

from stunnerd.turn.effects import Address
from stunnerd.turn.errors import PeerAddressFamilyMismatchError

DEFAULT_LIFETIME_S = 600
MAX_LIFETIME_S = 3600
PERMISSION_LIFETIME_S = 300
CHANNEL_LIFETIME_S = 600


class AllocationState(enum.Enum):
    """Where an allocation stands; the transitions are `table.AllocationTable`'s."""

    PENDING = "pending"  # authenticated Allocate, waiting for the edge to open its relay
    ACTIVE = "active"  # relaying
    REVOKED = "revoked"  # relaying, but the config no longer grants its credentials
    DELETED = "deleted"  # gone: refreshed to 0, expired, its client gone, or shut down


@dataclass(slots=True)  # not frozen, as the effects (`stunnerd.turn.effects`)
class Pending:
    """An authenticated Allocate in state PENDING: what the answer needs once the relay is open."""

    transaction_id: bytes
    user_id: str
    key: bytes
    lifetime_s: int
    family: int
    reserve_next: bool = False
    username: str = ""
    tcp: bool = False  # RFC 6062: a TCP relay
    additional: int = 0  # a dual allocation's second family (RFC 8656 §7.2)
    refused: int = 0  # a dual allocation's family this listener has no relay address for


class Channel:
    __slots__ = ("expires", "number", "peer", "routed")

    def __init__(self, number: int, peer: Address, expires: float) -> None:
        self.number = number
        self.peer = peer
        self.expires = expires
        self.routed = False


class Allocation:
    """One client's allocation; a dual one (RFC 8656 §7.2) has an IPv6 `additional` relay too."""

    __slots__ = (
        "additional",
        "channels",
        "client",
        "expires",
        "families",
        "family",
        "key",
        "peer_channels",
        "permissions",
        "relay",
        "state",
        "tcp",
        "user_id",
        "username",
    )

    def __init__(
        self,
        client: Address,
        user_id: str,
        key: bytes,
        relay: Address,
        family: int,
        expires: float,
        username: str = "",
        tcp: bool = False,
        additional: Address | None = None,
    ) -> None:
        self.client = client
        self.user_id = user_id
        self.key = key
        self.username = username  # as the Allocate sent it
        self.state = AllocationState.ACTIVE
        self.relay = relay
        self.family = family
        self.additional = additional
        self.families = frozenset(
            (family, family_of(additional[0])) if additional is not None else (family,)
        )
        self.expires = expires
        self.permissions: dict[str, float] = {}
        self.channels: dict[int, Channel] = {}
        self.peer_channels: dict[Address, Channel] = {}
        self.tcp = tcp  # RFC 6062: the relay is a TCP listening socket (no channels, no UDP)


def family_of(ip: str) -> int:
    return 6 if ":" in ip else 4


def unmapped(ip: str) -> str:
    """An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4 address it carries.

    A peer given in that form is an IPv4 peer: it is judged, permitted and relayed as one, so it
    gets no way around the IPv4 routes or protected ranges, nor onto an IPv6 relay socket.
    """
    if ":" not in ip:
        return ip
    try:
        mapped = ipaddress.IPv6Address(ip).ipv4_mapped
    except ValueError:
        return ip
    return ip if mapped is None else str(mapped)


def unmapped_address(addr: Address) -> Address:
    ip = unmapped(addr[0])
    return addr if ip is addr[0] else (ip, addr[1])


def peer_of(alloc: Allocation, peer: Address) -> Address:
    """An XOR-PEER-ADDRESS as every method judges it, or 443 Peer Address Family Mismatch.

    One rule for CreatePermission (RFC 8656 §10.2), ChannelBind (§12.2) and Connect (RFC 6062
    §5.2): an IPv4-mapped address is its IPv4 address, and a peer whose family the allocation
    has no relay for is refused with 443 before the routes are asked (403). An IPv6 address
    that carries an IPv4 one (NAT64, 6to4, ...) is an IPv6 peer here; the routes judge what it
    carries (`stunnerd.routing`).
    """
    peer = unmapped_address(peer)
    if family_of(peer[0]) not in alloc.families:
        raise PeerAddressFamilyMismatchError()
    return peer


def lifetime(requested: int | None) -> int:
    """RFC 8656 §7.2: the default unless asked for more, never above the maximum."""
    if requested is None:
        return DEFAULT_LIFETIME_S
    return max(DEFAULT_LIFETIME_S, min(requested, MAX_LIFETIME_S))
