"""What the engine asks its edge to do, and what it reports happened.

The engine never touches a socket: each call returns a list of these values and the asyncio edge
carries them out. Commands are imperative (`SendToClient`), observations past tense
(`AllocationCreated`). Channel routes are the engine telling the edge which ChannelData flows it
may forward on its fast path without asking again.

They are slotted dataclasses that nothing changes once built, but not frozen ones: an Allocate
builds several, and a frozen dataclass's __init__ (object.__setattr__ per field) costs about
three times a plain one's.
"""

from __future__ import annotations

from dataclasses import dataclass

Address = tuple[str, int]


@dataclass(slots=True)
class SendToClient:
    client: Address
    data: bytes


@dataclass(slots=True)
class SendToPeer:
    client: Address  # identifies the allocation, hence the relay socket
    peer: Address
    data: bytes


@dataclass(slots=True)
class OpenRelay:
    """Open a UDP relay for this client's pending Allocate; report via relay_opened/failed."""

    client: Address
    family: int  # 4 or 6
    even_port: bool
    reserve_next: bool = False  # EVEN-PORT with R: also hold port + 1 for a later Allocate
    reserved_port: int = 0  # RESERVATION-TOKEN: use the socket held on this port
    tcp: bool = False  # RFC 6062: a listening TCP socket instead of a UDP one
    additional_family: int = 0  # a dual allocation (RFC 8656 §7.2): also a relay of this family
    user_id: str = ""  # whose allocation it is (the cluster-wide quota leases per user)
    lifetime_s: int = 0  # the lifetime the allocation will get


@dataclass(slots=True)
class ReleasePort:
    """A reservation (RFC 8656 §14.9) lapsed unused: close the socket held on this port."""

    port: int


@dataclass(slots=True)
class CloseRelay:
    client: Address


@dataclass(slots=True)
class ConnectPeer:
    """RFC 6062 §5.2: connect from `client`'s TCP relay address to `peer`; report the outcome
    with `peer_connected` or `peer_connect_failed`."""

    client: Address
    connection_id: int
    peer: Address


@dataclass(slots=True)
class BindPeerConnection:
    """RFC 6062 §5.4: from now on the stream of `data_client` carries the raw bytes of the peer
    connection `connection_id`, both ways (sent after the ConnectionBind success answer)."""

    data_client: Address
    connection_id: int


@dataclass(slots=True)
class ClosePeerConnection:
    """Close a peer connection (connecting, waiting for its bind, or bound: then its data
    connection too)."""

    connection_id: int


@dataclass(slots=True)
class ChannelRouteAdded:
    """ChannelData between client and peer on this channel may now flow without the engine.

    Sent again for a routed channel when `offload` changes: False while the allocation's
    credentials are withdrawn by the config (it still relays, in user space only).
    """

    client: Address
    channel: int
    peer: Address
    offload: bool = True


@dataclass(slots=True)
class ChannelRouteRemoved:
    client: Address
    channel: int
    peer: Address


@dataclass(slots=True)
class AllocationCreated:
    client: Address
    user_id: str
    relay: Address
    lifetime_s: int
    additional: Address | None = None  # the IPv6 relay of a dual allocation


@dataclass(slots=True)
class AllocationDeleted:
    client: Address
    user_id: str
    reason: str  # "refresh", "expired", "closed", "shutdown"


@dataclass(slots=True)
class AllocationRefreshed:
    """A Refresh extended an allocation: it now lives `lifetime_s` more seconds."""

    client: Address
    user_id: str
    lifetime_s: int


@dataclass(slots=True)
class AllocationAborted:
    """A pending Allocate ended without an allocation (relay failure, quota, client gone)."""

    client: Address


Effect = (
    SendToClient
    | SendToPeer
    | OpenRelay
    | CloseRelay
    | ReleasePort
    | ConnectPeer
    | BindPeerConnection
    | ClosePeerConnection
    | ChannelRouteAdded
    | ChannelRouteRemoved
    | AllocationCreated
    | AllocationDeleted
    | AllocationRefreshed
    | AllocationAborted
)

TcpRelayEffect = OpenRelay | CloseRelay | ConnectPeer | BindPeerConnection | ClosePeerConnection
"""What a stream listener's TCP relays carry out (an `OpenRelay` only when its `tcp` is set)."""
