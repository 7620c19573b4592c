"""The TURN methods on UDP relays, once a request is authenticated (RFC 8656 §7 to §11).

Allocate (both halves: the request, then the edge's `relay_opened` or `relay_failed`), Refresh,
CreatePermission and ChannelBind. Each handler checks the request in its RFC's order and raises a
`TurnError` at the first refusal (the engine answers it); what it changes, it changes through the
`AllocationTable`, and what it answers goes through the `Answerer`.

What one allocation holds is capped (`max_permissions`, `max_channels`): an authenticated client
could otherwise install a permission for every address a route admits. Past a cap the request
gets 508 Insufficient Capacity, which RFC 8656 §9.2 and §11.2 name for exactly this, and installs
nothing; refreshing what the allocation already holds is never refused.
"""

from __future__ import annotations

from typing import Any

from stunnerd.turn import codec
from stunnerd.turn.allocation import (
    Allocation,
    Pending,
    lifetime,
    peer_of,
    unmapped_address,
)
from stunnerd.turn.answers import Answerer
from stunnerd.turn.auth import AuthenticatedRequest
from stunnerd.turn.codec import FAMILY_IPV4, FAMILY_IPV6, Method
from stunnerd.turn.effects import (
    Address,
    AllocationAborted,
    AllocationCreated,
    AllocationRefreshed,
    Effect,
    OpenRelay,
)
from stunnerd.turn.errors import (
    AllocationMismatchError,
    AllocationQuotaReachedError,
    BadRequestError,
    ForbiddenError,
    InsufficientCapacityError,
    PeerAddressFamilyMismatchError,
    TurnError,
)
from stunnerd.turn.families import FAMILY_CODES, FamilyChoice, choose_families
from stunnerd.turn.guard import MAX_CHANNELS_PER_ALLOCATION, MAX_PERMISSIONS_PER_ALLOCATION
from stunnerd.turn.policies import Policies
from stunnerd.turn.table import AllocationTable
from stunnerd.turn.tcp_connections import check_transport

PERMISSIONS_FULL = "Insufficient Capacity (permissions per allocation)"
CHANNELS_FULL = "Insufficient Capacity (channels per allocation)"
PERMISSIONS_LIMIT = "permissions_per_allocation"


class AllocationHandlers:
    """Allocate, Refresh, CreatePermission, ChannelBind over one listener's allocation table."""

    __slots__ = (
        "answers",
        "max_channels",
        "max_permissions",
        "relay_family",
        "stream",
        "table",
        "tcp_relays",
    )

    def __init__(
        self,
        table: AllocationTable,
        answers: Answerer,
        *,
        relay_family: int,
        stream: bool,
        tcp_relays: bool,
        max_permissions: int = MAX_PERMISSIONS_PER_ALLOCATION,
        max_channels: int = MAX_CHANNELS_PER_ALLOCATION,
    ) -> None:
        self.max_permissions = max_permissions
        self.max_channels = max_channels
        self.table = table
        self.answers = answers
        self.relay_family = relay_family  # the listener's own family
        self.stream = stream  # a TCP or TLS listener
        self.tcp_relays = tcp_relays  # RFC 6062 allocations may be made here

    # ------------------------------------------------------------------ Allocate

    def allocate(
        self, req: AuthenticatedRequest, policies: Policies, now: float, out: list[Effect]
    ) -> None:
        """RFC 8656 §7.2: checked here, answered once the edge opened the relay."""
        client, msg = req.client, req.message
        table = self.table
        pending = table.pending.get(client)
        if pending is not None:
            if pending.transaction_id != msg.transaction_id:
                raise AllocationMismatchError()
            return  # a retransmission: its answer will come
        if client in table.active:
            raise AllocationMismatchError()
        attrs = msg.attributes
        tcp, families = self._relay_kind(attrs)
        reserved_port = self._reserved_port(attrs, req.user_id, policies, now)
        even = attrs.get("EVEN-PORT")
        reserve_next = even is not None and bool(even & 0x80)
        pending = Pending(
            msg.transaction_id,
            req.user_id,
            req.key,
            lifetime(attrs.get("LIFETIME")),
            families.family,
            reserve_next,
            req.username,
            tcp,
            families.additional,
            families.refused,
        )
        table.begin(client, pending)
        out.append(
            OpenRelay(
                client,
                families.family,
                even is not None,
                reserve_next,
                reserved_port,
                tcp,
                families.additional,
                req.user_id,
                pending.lifetime_s,
            )
        )

    def _relay_kind(self, attrs: dict[str, Any]) -> tuple[bool, FamilyChoice]:
        """Whether the relay is TCP (RFC 6062) and its address families (RFC 8656 §7.2)."""
        transport = attrs.get("REQUESTED-TRANSPORT")
        if transport is None:
            raise BadRequestError("Missing REQUESTED-TRANSPORT")
        tcp = check_transport(transport, attrs, stream=self.stream, tcp_relays=self.tcp_relays)
        families = choose_families(attrs, self.table.relay_ips, self.relay_family)
        if tcp and (families.additional or families.refused):
            raise BadRequestError("ADDITIONAL-ADDRESS-FAMILY with a TCP relay")
        return tcp, families

    def _reserved_port(
        self, attrs: dict[str, Any], user_id: str, policies: Policies, now: float
    ) -> int:
        """The user's quota (486), and the port held under a RESERVATION-TOKEN (0: none)."""
        token = attrs.get("RESERVATION-TOKEN")
        reservations = self.table.reservations
        if token is not None:
            if "EVEN-PORT" in attrs or "REQUESTED-ADDRESS-FAMILY" in attrs:
                raise BadRequestError("RESERVATION-TOKEN with EVEN-PORT or family")
            if not reservations.valid(token, now):
                raise InsufficientCapacityError("Insufficient Capacity (no such reservation)")
        if not policies.quota.allows(user_id, self.table.usage.counts):
            raise AllocationQuotaReachedError(limit=policies.quota.refusal)
        return reservations.claim(token) if token is not None else 0

    def relay_opened(
        self, client: Address, port: int, now: float, reserved_port: int, additional_port: int
    ) -> list[Effect]:
        """The second half of Allocate: the relay is open, the allocation ACTIVE; answer."""
        out: list[Effect] = []
        opened = self.table.open(client, port, now, reserved_port, additional_port)
        if opened is None:
            self.table.orphaned(client, reserved_port, out)
            return out
        pending, alloc = opened
        attrs: list[tuple[str, Any]] = [("XOR-RELAYED-ADDRESS", alloc.relay)]
        if alloc.additional is not None:
            attrs.append(("XOR-RELAYED-ADDRESS", alloc.additional))
        if pending.refused:
            code = FAMILY_IPV6 if pending.refused == 6 else FAMILY_IPV4
            attrs.append(("ADDRESS-ERROR-CODE", (code, 440, "Address Family not Supported")))
        attrs.append(("LIFETIME", pending.lifetime_s))
        attrs.append(("XOR-MAPPED-ADDRESS", unmapped_address(client)))
        if reserved_port:
            attrs.append(("RESERVATION-TOKEN", self.table.hold_port(client, reserved_port, now)))
        self.answers.success(
            out, client, Method.ALLOCATE, pending.transaction_id, attrs, key=pending.key, now=now
        )
        out.append(
            AllocationCreated(
                client, pending.user_id, alloc.relay, pending.lifetime_s, alloc.additional
            )
        )
        return out

    def relay_failed(self, client: Address, now: float, error: TurnError) -> list[Effect]:
        """The edge could not open the relay of a pending Allocate: answer `error`."""
        out: list[Effect] = []
        pending = self.table.abort(client)
        if pending is None:
            return out
        self.answers.error(
            out, client, Method.ALLOCATE, pending.transaction_id, error, key=pending.key, now=now
        )
        out.append(AllocationAborted(client))
        return out

    # ------------------------------------------------------------------ on an allocation

    def refresh(
        self, req: AuthenticatedRequest, policies: Policies, now: float, out: list[Effect]
    ) -> None:
        """RFC 8656 §7.3: LIFETIME 0 deletes, otherwise the allocation is extended."""
        alloc = self.table.owned(req, now, out)
        attrs = req.message.attributes
        family_code = attrs.get("REQUESTED-ADDRESS-FAMILY")
        if family_code is not None and FAMILY_CODES.get(family_code) not in alloc.families:
            raise PeerAddressFamilyMismatchError()
        requested = attrs.get("LIFETIME")
        if requested == 0:
            self.table.delete(alloc, "refresh", out)
            granted = 0
        else:
            granted = lifetime(requested)
            self.table.refresh(alloc, granted, now)
            out.append(AllocationRefreshed(alloc.client, alloc.user_id, granted))
        self._succeed(req, {"LIFETIME": granted}, now, out)

    def create_permission(
        self, req: AuthenticatedRequest, policies: Policies, now: float, out: list[Effect]
    ) -> None:
        """RFC 8656 §9: every XOR-PEER-ADDRESS must be acceptable or nothing is installed."""
        alloc = self.table.owned(req, now, out)
        if not req.peers:
            raise BadRequestError("Missing XOR-PEER-ADDRESS")
        peers = [peer_of(alloc, peer) for peer in req.peers]
        for ip, _port in peers:
            if not policies.peers.admits_ip(ip):
                raise ForbiddenError()
        added = {ip for ip, _port in peers if ip not in alloc.permissions}
        if len(alloc.permissions) + len(added) > self.max_permissions:
            raise InsufficientCapacityError(PERMISSIONS_FULL, limit=PERMISSIONS_LIMIT)
        for ip, _port in peers:
            self.table.install_permission(alloc, ip, now)
        self.table.sync_routes(alloc, policies.peers, now, out)
        self._succeed(req, {}, now, out)

    def channel_bind(
        self, req: AuthenticatedRequest, policies: Policies, now: float, out: list[Effect]
    ) -> None:
        """RFC 8656 §11.2: bind or refresh; a channel and a peer are bound one to one."""
        alloc = self.table.owned(req, now, out)
        if alloc.tcp:
            raise BadRequestError("Bad Request (no channels on a TCP allocation)")
        number, peer = _channel_and_peer(req.message.attributes, alloc)
        existing = alloc.channels.get(number)
        if existing is not None and existing.peer != peer:
            raise BadRequestError("Channel already bound to another peer")
        other = alloc.peer_channels.get(peer)
        if other is not None and other.number != number:
            raise BadRequestError("Peer already bound to another channel")
        if not policies.peers.admits(peer[0], peer[1]):
            # a channel names a transport address, so the port must fall in an admitting
            # cluster's range too (CreatePermission carries no port and checks the IP only)
            raise ForbiddenError()
        if existing is None and len(alloc.channels) >= self.max_channels:
            raise InsufficientCapacityError(CHANNELS_FULL, limit="channels_per_allocation")
        if peer[0] not in alloc.permissions and len(alloc.permissions) >= self.max_permissions:
            raise InsufficientCapacityError(PERMISSIONS_FULL, limit=PERMISSIONS_LIMIT)
        self.table.bind_channel(alloc, number, peer, now)
        self.table.sync_routes(alloc, policies.peers, now, out)
        self._succeed(req, {}, now, out)

    def _succeed(
        self, req: AuthenticatedRequest, attrs: dict[str, Any], now: float, out: list[Effect]
    ) -> None:
        msg = req.message
        self.answers.success(
            out, req.client, msg.message_method, msg.transaction_id, attrs, key=req.key, now=now
        )


def _channel_and_peer(attrs: dict[str, Any], alloc: Allocation) -> tuple[int, Address]:
    """ChannelBind's CHANNEL-NUMBER (RFC 8656 §12) and XOR-PEER-ADDRESS, or a `TurnError`."""
    number = attrs.get("CHANNEL-NUMBER")
    peer = attrs.get("XOR-PEER-ADDRESS")
    if number is None or not codec.CHANNEL_MIN <= number <= codec.CHANNEL_MAX:
        raise BadRequestError("Bad or missing CHANNEL-NUMBER")
    if peer is None:
        raise BadRequestError("Missing XOR-PEER-ADDRESS")
    return number, peer_of(alloc, peer)
