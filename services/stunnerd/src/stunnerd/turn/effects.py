"""What the engine asks its edge to do, and what it reports happened.

The engine never touches a socket: each call returns a list of these values and the asyncio edge
carries them out. Commands are imperative (`SendToClient`), observations past tense
(`AllocationCreated`). Channel routes are the engine telling the edge which ChannelData flows it
may forward on its fast path without asking again.
"""

from __future__ import annotations

from dataclasses import dataclass

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SendToClient:
    client: Address
    data: bytes


@dataclass(frozen=True, slots=True)
class SendToPeer:
    client: Address  # identifies the allocation, hence the relay socket
    peer: Address
    data: bytes


@dataclass(frozen=True, slots=True)
class OpenRelay:
    """Open a UDP relay for this client's pending Allocate; report via relay_opened/failed."""

    client: Address
    family: int  # 4 or 6
    even_port: bool
    reserve_next: bool = False  # EVEN-PORT with R: also hold port + 1 for a later Allocate
    reserved_port: int = 0  # RESERVATION-TOKEN: use the socket held on this port


@dataclass(frozen=True, slots=True)
class ReleasePort:
    """A reservation (RFC 8656 §14.9) lapsed unused: close the socket held on this port."""

    port: int


@dataclass(frozen=True, slots=True)
class CloseRelay:
    client: Address


@dataclass(frozen=True, slots=True)
class ChannelRouteAdded:
    """ChannelData between client and peer on this channel may now flow without the engine.

    Sent again for a routed channel when `offload` changes: False while the allocation's
    credentials are withdrawn by the config (it still relays, in user space only).
    """

    client: Address
    channel: int
    peer: Address
    offload: bool = True


@dataclass(frozen=True, slots=True)
class ChannelRouteRemoved:
    client: Address
    channel: int
    peer: Address


@dataclass(frozen=True, slots=True)
class AllocationCreated:
    client: Address
    user_id: str
    relay: Address
    lifetime_s: int


@dataclass(frozen=True, slots=True)
class AllocationDeleted:
    client: Address
    user_id: str
    reason: str  # "refresh", "expired", "closed", "shutdown"


Effect = (
    SendToClient
    | SendToPeer
    | OpenRelay
    | CloseRelay
    | ReleasePort
    | ChannelRouteAdded
    | ChannelRouteRemoved
    | AllocationCreated
    | AllocationDeleted
)
