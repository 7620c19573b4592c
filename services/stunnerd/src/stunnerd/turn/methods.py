"""The TURN methods a `TurnEngine` answers once a request is authenticated (RFC 8656 §7 to §11).

Allocate, Refresh, CreatePermission and ChannelBind, and the bookkeeping they share: installing
permissions and channels with their deadlines, keeping the ChannelData routes in step
(`ChannelRouteAdded/Removed` are emitted here and only here), deleting an allocation, and
answering (every answer to a request goes through the retransmission cache). `TurnEngine`
inherits these (through `RelayLifecycle`, which adds the relay handshake and timers) and adds
dispatch and peer traffic; the state they share is declared on `TurnMethods` so each part
type-checks on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stunnerd.turn import codec
from stunnerd.turn.allocation import (
    CHANNEL_LIFETIME_S,
    PERMISSION_LIFETIME_S,
    Allocation,
    Channel,
    family_of,
    lifetime,
    unmapped,
    unmapped_address,
)
from stunnerd.turn.auth import AuthenticatedRequest
from stunnerd.turn.codec import Class
from stunnerd.turn.effects import (
    Address,
    AllocationDeleted,
    AllocationRefreshed,
    ChannelRouteAdded,
    ChannelRouteRemoved,
    CloseRelay,
    Effect,
    OpenRelay,
    SendToClient,
)
from stunnerd.turn.families import FAMILY_CODES, FamilyRefusal, choose_families
from stunnerd.turn.policies import UserUsage
from stunnerd.turn.reservations import Reservations
from stunnerd.turn.retransmit import RetransmitCache
from stunnerd.turn.tcp_connections import PeerConnections, transport_refusal
from stunnerd.turn.timers import DeadlineKind, Deadlines

if TYPE_CHECKING:
    from stunnerd.turn.engine import Policies


@dataclass(frozen=True, slots=True)
class Pending:
    """An authenticated Allocate waiting for the edge to open its relay socket."""

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


class TurnMethods:
    """The request handlers; the state below is set up by `TurnEngine.__init__`."""

    relay_family: int
    stream: bool
    tcp_relays: bool  # this engine may open TCP relays (RFC 6062)
    relay_ips: dict[int, str]  # family -> advertised relay IP
    software: str | None
    policies: Policies
    usage: UserUsage
    allocations: dict[Address, Allocation]
    _pending: dict[Address, Pending]
    _cache: RetransmitCache
    _deadlines: Deadlines
    _reservations: Reservations
    _tcp: PeerConnections

    def _allocate(self, req: AuthenticatedRequest, now: float, out: list[Effect]) -> None:
        """RFC 8656 §7.2."""
        client, msg = req.client, req.message
        if client in self._pending:
            if self._pending[client].transaction_id != msg.transaction_id:
                self._fail(req, 437, "Allocation Mismatch", now, out)
            return
        if client in self.allocations:
            self._fail(req, 437, "Allocation Mismatch", now, out)
            return
        attrs = msg.attributes
        transport = attrs.get("REQUESTED-TRANSPORT")
        if transport is None:
            self._fail(req, 400, "Missing REQUESTED-TRANSPORT", now, out)
            return
        refusal = transport_refusal(
            transport, attrs, stream=self.stream, tcp_relays=self.tcp_relays
        )
        if refusal is not None:
            self._fail(req, refusal[0], refusal[1], now, out)
            return
        tcp = transport & 0xFF000000 == codec.TRANSPORT_TCP
        families = choose_families(attrs, self.relay_ips, self.relay_family)
        if isinstance(families, FamilyRefusal):
            self._fail(req, families.code, families.reason, now, out)
            return
        if tcp and (families.additional or families.refused):
            self._fail(req, 400, "ADDITIONAL-ADDRESS-FAMILY with a TCP relay", now, out)
            return
        reserved_port = 0
        if "RESERVATION-TOKEN" in attrs:
            if "EVEN-PORT" in attrs or "REQUESTED-ADDRESS-FAMILY" in attrs:
                self._fail(req, 400, "RESERVATION-TOKEN with EVEN-PORT or family", now, out)
                return
            if not self._reservations.valid(attrs["RESERVATION-TOKEN"], now):
                self._fail(req, 508, "Insufficient Capacity (no such reservation)", now, out)
                return
        if not self.policies.quota.allows(req.user_id, self.usage.counts):
            self._fail(req, 486, "Allocation Quota Reached", now, out)
            return
        if "RESERVATION-TOKEN" in attrs:
            reserved_port = self._reservations.claim(attrs["RESERVATION-TOKEN"])
        even = attrs.get("EVEN-PORT")
        reserve_next = even is not None and bool(even & 0x80)
        self._pending[client] = Pending(
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
                self._pending[client].lifetime_s,
            )
        )

    def _refresh(self, req: AuthenticatedRequest, now: float, out: list[Effect]) -> None:
        """RFC 8656 §7.3: LIFETIME 0 deletes, otherwise the allocation is extended."""
        alloc = self._owned_allocation(req, now, out)
        if alloc is None:
            return
        attrs = req.message.attributes
        family_code = attrs.get("REQUESTED-ADDRESS-FAMILY")
        if family_code is not None and FAMILY_CODES.get(family_code) not in alloc.families:
            self._fail(req, 443, "Peer Address Family Mismatch", now, out)
            return
        requested = attrs.get("LIFETIME")
        if requested == 0:
            self._delete(alloc, "refresh", out)
            granted = 0
        else:
            granted = lifetime(requested)
            alloc.expires = now + granted
            self._deadlines.schedule(alloc.expires, DeadlineKind.ALLOCATION, alloc.client, None)
            out.append(AllocationRefreshed(alloc.client, alloc.user_id, granted))
        self._succeed(req, {"LIFETIME": granted}, now, out)

    def _create_permission(self, req: AuthenticatedRequest, now: float, out: list[Effect]) -> None:
        """RFC 8656 §9: every XOR-PEER-ADDRESS must be acceptable or nothing is installed."""
        alloc = self._owned_allocation(req, now, out)
        if alloc is None:
            return
        peers = [unmapped_address(peer) for peer in req.peers]
        if not peers:
            self._fail(req, 400, "Missing XOR-PEER-ADDRESS", now, out)
            return
        for ip, _port in peers:
            if family_of(ip) not in alloc.families:
                self._fail(req, 443, "Peer Address Family Mismatch", now, out)
                return
            if not self.policies.peers.admits_ip(ip):
                self._fail(req, 403, "Forbidden (peer not admitted by any route)", now, out)
                return
        for ip, _port in peers:
            self._install_permission(alloc, ip, now)
        self._sync_routes(alloc, now, out)
        self._succeed(req, {}, now, out)

    def _channel_bind(self, req: AuthenticatedRequest, now: float, out: list[Effect]) -> None:
        """RFC 8656 §11.2: bind or refresh; a channel and a peer are bound one to one."""
        alloc = self._owned_allocation(req, now, out)
        if alloc is None:
            return
        if alloc.tcp:
            self._fail(req, 400, "Bad Request (no channels on a TCP allocation)", now, out)
            return
        attrs = req.message.attributes
        number = attrs.get("CHANNEL-NUMBER")
        peer = attrs.get("XOR-PEER-ADDRESS")
        if number is None or not codec.CHANNEL_MIN <= number <= codec.CHANNEL_MAX:
            self._fail(req, 400, "Bad or missing CHANNEL-NUMBER", now, out)
            return
        if peer is None:
            self._fail(req, 400, "Missing XOR-PEER-ADDRESS", now, out)
            return
        peer = (unmapped(peer[0]), peer[1])
        if family_of(peer[0]) not in alloc.families:
            self._fail(req, 443, "Peer Address Family Mismatch", now, out)
            return
        existing = alloc.channels.get(number)
        if existing is not None and existing.peer != peer:
            self._fail(req, 400, "Channel already bound to another peer", now, out)
            return
        other = alloc.peer_channels.get(peer)
        if other is not None and other.number != number:
            self._fail(req, 400, "Peer already bound to another channel", now, out)
            return
        if not self.policies.peers.admits(peer[0], peer[1]):
            # a channel names a transport address, so the port must fall in an admitting
            # cluster's range too (CreatePermission carries no port and checks the IP only)
            self._fail(req, 403, "Forbidden (peer not admitted by any route)", now, out)
            return
        channel = existing or Channel(number, peer, 0.0)
        channel.expires = now + CHANNEL_LIFETIME_S
        alloc.channels[number] = channel
        alloc.peer_channels[peer] = channel
        self._deadlines.schedule(channel.expires, DeadlineKind.CHANNEL, alloc.client, number)
        self._install_permission(alloc, peer[0], now)
        self._sync_routes(alloc, now, out)
        self._succeed(req, {}, now, out)

    # ------------------------------------------------------------------ helpers

    def _owned_allocation(
        self, req: AuthenticatedRequest, now: float, out: list[Effect]
    ) -> Allocation | None:
        """The client's allocation if this user made it (upstream §3.5), else answer 437."""
        alloc = self.allocations.get(req.client)
        if alloc is None or alloc.user_id != req.user_id or alloc.expires <= now:
            self._fail(req, 437, "Allocation Mismatch", now, out)
            return None
        if alloc.revoked:  # authenticated under the config in force: granted again
            alloc.key, alloc.username = req.key, req.username
            self._set_revoked(alloc, False, out)
        return alloc

    def _install_permission(self, alloc: Allocation, ip: str, now: float) -> None:
        expires = now + PERMISSION_LIFETIME_S
        alloc.permissions[ip] = expires
        self._deadlines.schedule(expires, DeadlineKind.PERMISSION, alloc.client, ip)

    def _sync_routes(self, alloc: Allocation, now: float, out: list[Effect]) -> None:
        peers = self.policies.peers
        for channel in alloc.channels.values():
            ip, port = channel.peer
            perm = alloc.permissions.get(ip)
            wanted = (
                channel.expires > now and perm is not None and perm > now and peers.admits(ip, port)
            )
            if wanted != channel.routed:
                channel.routed = wanted
                if wanted:
                    out.append(
                        ChannelRouteAdded(
                            alloc.client, channel.number, channel.peer, not alloc.revoked
                        )
                    )
                else:
                    out.append(ChannelRouteRemoved(alloc.client, channel.number, channel.peer))

    def _set_revoked(self, alloc: Allocation, revoked: bool, out: list[Effect]) -> None:
        """Mark the allocation's credentials withdrawn (or granted again) and tell the edge which
        of its routed channels may be offloaded."""
        if revoked == alloc.revoked:
            return
        alloc.revoked = revoked
        for channel in alloc.channels.values():
            if channel.routed:
                out.append(
                    ChannelRouteAdded(alloc.client, channel.number, channel.peer, not revoked)
                )

    def _delete(self, alloc: Allocation, reason: str, out: list[Effect]) -> None:
        for channel in alloc.channels.values():
            if channel.routed:
                channel.routed = False
                out.append(ChannelRouteRemoved(alloc.client, channel.number, channel.peer))
        if alloc.tcp:
            self._tcp.drop_allocation(alloc.client, out)
        del self.allocations[alloc.client]
        self.usage.remove(alloc.user_id)
        self._deadlines.compact(self.allocations, len(self._reservations))
        out.append(CloseRelay(alloc.client))
        out.append(AllocationDeleted(alloc.client, alloc.user_id, reason))

    def _succeed(
        self, req: AuthenticatedRequest, attrs: dict[str, Any], now: float, out: list[Effect]
    ) -> None:
        msg = req.message
        answer = codec.encode(
            msg.message_method,
            Class.RESPONSE,
            msg.transaction_id,
            attrs,
            key=req.key,
            software=self.software,
        )
        self._answer(out, req.client, msg, answer, now)

    def _fail(
        self, req: AuthenticatedRequest, code: int, reason: str, now: float, out: list[Effect]
    ) -> None:
        msg = req.message
        answer = codec.error_response(
            msg.message_method,
            msg.transaction_id,
            code,
            reason,
            key=req.key,
            software=self.software,
        )
        self._answer(out, req.client, msg, answer, now)

    def _reply_error(
        self,
        out: list[Effect],
        client: Address,
        msg: codec.Message,
        code: int,
        reason: str,
        now: float,
    ) -> None:
        answer = codec.error_response(
            msg.message_method, msg.transaction_id, code, reason, software=self.software
        )
        self._answer(out, client, msg, answer, now)

    def _answer(
        self, out: list[Effect], client: Address, msg: codec.Message, answer: bytes, now: float
    ) -> None:
        self._cache.remember(client, msg.transaction_id, answer, now)
        out.append(SendToClient(client, answer))

    def _send(self, out: list[Effect], client: Address, data: bytes) -> None:
        out.append(SendToClient(client, data))
