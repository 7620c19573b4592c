"""The TURN server state machine for one listener (RFC 8656 over RFC 8489), with no I/O at all.

Bytes, the client's transport address and `now` (the edge's monotonic clock, seconds) go in; a list
of effects comes out. One engine serves one listener: on UDP the client address is the 5-tuple, on
stream transports the edge gives every connection its own address and calls `client_closed`.

Shape of the machine:

* Allocation is two-phase. An authenticated Allocate yields `OpenRelay`; the edge binds a UDP
  socket and calls `relay_opened(client, port, now)` (or `relay_failed`), which produces the
  success (or 508) answer. Retransmissions of the pending request are dropped meanwhile.
* Every answer to a request is cached per (client, transaction id) for `RETRANSMIT_CACHE_S`, so a
  retransmitted request gets the same bytes back (RFC 8489 §6.3.1), even after a Refresh deleted
  the allocation.
* Lifetimes (allocations, permissions, channels) sit in a heap of deadlines. `next_deadline()` tells
  the edge when to call `tick(now)`; stale heap entries are skipped, so refreshes are O(log n).
* ChannelData is the hot path. A channel is *routed* while it is bound, its peer IP has a live
  permission and the peer policy admits the peer's address; the engine announces route changes
  (`ChannelRouteAdded/Removed`) so the edge can forward ChannelData both ways without calling in.
  `handle_client` still forwards ChannelData itself for edges that do not keep a fast path.
* Policies (auth, peers, quota) are swapped by `set_policies`; routes are re-evaluated at once and
  existing allocations survive. Auth changes apply at the next authenticated request.

Deliberate differences from upstream (pion): a peer the policy refuses gets 403 on CreatePermission
and ChannelBind; a wrong username or password gets 401 (RFC 8489 §9.2.4) rather than 400; the user
quota is enforced (486). EVEN-PORT is honoured; with its R bit the next port is held for
`RESERVATION_LIFETIME_S` and a RESERVATION-TOKEN returned (RFC 8656 §7.2); unknown tokens get 508.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stunnerd.turn import codec
from stunnerd.turn.codec import Class, Method
from stunnerd.turn.effects import (
    Address,
    AllocationCreated,
    AllocationDeleted,
    ChannelRouteAdded,
    ChannelRouteRemoved,
    CloseRelay,
    Effect,
    OpenRelay,
    ReleasePort,
    SendToClient,
    SendToPeer,
)
from stunnerd.turn.policies import (
    AllowAllPeers,
    Authenticator,
    NoAuthenticator,
    NonceMint,
    PeerPolicy,
    UserQuota,
    UserUsage,
)

DEFAULT_LIFETIME_S = 600
MAX_LIFETIME_S = 3600
PERMISSION_LIFETIME_S = 300
CHANNEL_LIFETIME_S = 600
RESERVATION_LIFETIME_S = 30.0
RETRANSMIT_CACHE_S = 40.0
RETRANSMIT_CACHE_MAX = 8192
SOFTWARE = "stunnerd"

_AUTHENTICATED_METHODS = frozenset(
    {Method.ALLOCATE, Method.REFRESH, Method.CREATE_PERMISSION, Method.CHANNEL_BIND}
)


@dataclass(frozen=True, slots=True)
class Policies:
    authenticator: Authenticator
    peers: PeerPolicy
    quota: UserQuota


class Channel:
    __slots__ = ("expires", "number", "peer", "routed")

    def __init__(self, number: int, peer: Address, expires: float) -> None:
        self.number = number
        self.peer = peer
        self.expires = expires
        self.routed = False


class Allocation:
    __slots__ = (
        "channels",
        "client",
        "expires",
        "family",
        "key",
        "peer_channels",
        "permissions",
        "relay",
        "user_id",
    )

    def __init__(
        self, client: Address, user_id: str, key: bytes, relay: Address, family: int, expires: float
    ) -> None:
        self.client = client
        self.user_id = user_id
        self.key = key
        self.relay = relay
        self.family = family
        self.expires = expires
        self.permissions: dict[str, float] = {}
        self.channels: dict[int, Channel] = {}
        self.peer_channels: dict[Address, Channel] = {}


@dataclass(frozen=True, slots=True)
class _Pending:
    transaction_id: bytes
    user_id: str
    key: bytes
    lifetime_s: int
    family: int
    reserve_next: bool = False


@dataclass(frozen=True, slots=True)
class _Request:
    """An authenticated request: the parsed message, the user and the key to sign answers with."""

    message: codec.Message
    client: Address
    user_id: str
    key: bytes
    peers: tuple[Address, ...]  # every XOR-PEER-ADDRESS, in order


def _family_of(ip: str) -> int:
    return 6 if ":" in ip else 4


def _lifetime(requested: int | None) -> int:
    """RFC 8656 §7.2: the default unless asked for more, never above the maximum."""
    if requested is None:
        return DEFAULT_LIFETIME_S
    return max(DEFAULT_LIFETIME_S, min(requested, MAX_LIFETIME_S))


class TurnEngine:
    """One listener's TURN state. All methods are synchronous and return effects."""

    def __init__(
        self,
        *,
        relay_ip: str,
        nonce_secret: bytes,
        policies: Policies | None = None,
        usage: UserUsage | None = None,
        stream: bool = False,
        clock_offset_s: float = 0.0,
        software: str | None = SOFTWARE,
        nonce_lifetime_s: float | None = None,
    ) -> None:
        ipaddress.ip_address(relay_ip)  # fail early on a bad advertised address
        self.relay_ip = relay_ip
        self.relay_family = _family_of(relay_ip)
        self.stream = stream
        self.clock_offset_s = clock_offset_s  # unix time = now + offset (ephemeral expiry)
        self.software = software
        self.policies = policies or Policies(NoAuthenticator(), AllowAllPeers(), UserQuota())
        self.usage = usage if usage is not None else UserUsage()
        self._nonces = (
            NonceMint(nonce_secret)
            if nonce_lifetime_s is None
            else NonceMint(nonce_secret, nonce_lifetime_s)
        )
        self.allocations: dict[Address, Allocation] = {}
        self._pending: dict[Address, _Pending] = {}
        self._cache: dict[tuple[Address, bytes], tuple[float, bytes]] = {}
        self._deadlines: list[tuple[float, int, int, Address, Any]] = []
        self._seq = 0
        self._token_key = nonce_secret
        self.reservations: dict[bytes, tuple[int, float]] = {}  # token -> (port, expiry)
        self.stats_dropped = 0

    # ------------------------------------------------------------------ public API

    @property
    def allocation_count(self) -> int:
        return len(self.allocations)

    def set_policies(self, policies: Policies, now: float) -> list[Effect]:
        """Swap auth/peer/quota policies in place; re-evaluate channel routes for live traffic."""
        self.policies = policies
        out: list[Effect] = []
        for alloc in self.allocations.values():
            self._sync_routes(alloc, now, out)
        return out

    def next_deadline(self) -> float | None:
        return self._deadlines[0][0] if self._deadlines else None

    def handle_client(self, data: bytes, client: Address, now: float) -> list[Effect]:
        """One datagram (UDP, DTLS) or one de-framed message (TCP, TLS) from a client."""
        out: list[Effect] = []
        if not data:
            return out
        first = data[0]
        if 0x40 <= first <= 0x7F:
            self._channel_data(data, client, out)
            return out
        if first == 0 and data[1:2] == b"\x16":  # Send indication: the relay path, parse by hand
            fast = codec.parse_send_indication(data)
            if fast is not None:
                self._relay_to_peer(client, fast[0], fast[1], now, out)
                return out
        try:
            decoded = codec.decode(data)
        except codec.StunBadRequestError as exc:
            self._send(
                out,
                client,
                codec.error_response(
                    exc.method, exc.transaction_id, 400, str(exc), software=self.software
                ),
            )
            return out
        except codec.StunDecodeError:
            self.stats_dropped += 1
            return out
        msg = decoded.message
        klass = msg.message_class
        if klass == Class.INDICATION:
            if msg.message_method == Method.SEND and not decoded.unknown_required:
                self._send_indication(msg, client, now, out)
            return out
        if klass != Class.REQUEST:
            return out  # responses are not for a server
        cached = self._cache.get((client, msg.transaction_id))
        if cached is not None and cached[0] > now:
            out.append(SendToClient(client, cached[1]))
            return out
        if decoded.unknown_required:
            self._answer(
                out,
                client,
                msg,
                codec.error_response(
                    msg.message_method,
                    msg.transaction_id,
                    420,
                    "Unknown Attribute",
                    extra={"UNKNOWN-ATTRIBUTES": decoded.unknown_required},
                    software=self.software,
                ),
                now,
            )
            return out
        method = msg.message_method
        if method == Method.BINDING:
            self._send(
                out,
                client,
                codec.encode(
                    Method.BINDING,
                    Class.RESPONSE,
                    msg.transaction_id,
                    {"XOR-MAPPED-ADDRESS": client},
                    software=self.software,
                ),
            )
            return out
        if method not in _AUTHENTICATED_METHODS:
            self._reply_error(out, client, msg, 400, "Bad Request", now)
            return out
        request = self._authenticate(decoded, client, now, out)
        if request is None:
            return out
        handler: Callable[[_Request, float, list[Effect]], None] = {
            Method.ALLOCATE: self._allocate,
            Method.REFRESH: self._refresh,
            Method.CREATE_PERMISSION: self._create_permission,
            Method.CHANNEL_BIND: self._channel_bind,
        }[method]
        handler(request, now, out)
        return out

    def handle_peer(self, client: Address, peer: Address, data: bytes, now: float) -> list[Effect]:
        """A datagram from `peer` arrived on `client`'s relay (the edge's slow path)."""
        out: list[Effect] = []
        alloc = self.allocations.get(client)
        if alloc is None:
            return out
        ip, port = peer[0], peer[1]
        expires = alloc.permissions.get(ip)
        if expires is None or expires <= now or not self.policies.peers.admits(ip, port):
            self.stats_dropped += 1
            return out
        channel = alloc.peer_channels.get((ip, port))
        if channel is not None and channel.expires > now:
            out.append(
                SendToClient(client, codec.channel_data(channel.number, data, stream=self.stream))
            )
            return out
        out.append(
            SendToClient(client, codec.data_indication((ip, port), data, _transaction_id(self)))
        )
        return out

    def relay_opened(
        self, client: Address, port: int, now: float, reserved_port: int = 0
    ) -> list[Effect]:
        """The edge bound the relay socket for a pending Allocate: answer with success.

        `reserved_port` is the socket the edge holds for an EVEN-PORT request with the R bit.
        """
        out: list[Effect] = []
        pending = self._pending.pop(client, None)
        if pending is None:
            out.append(CloseRelay(client))  # the client went away meanwhile
            if reserved_port:
                out.append(ReleasePort(reserved_port))
            return out
        relay = (self.relay_ip, port)
        alloc = Allocation(
            client, pending.user_id, pending.key, relay, pending.family, now + pending.lifetime_s
        )
        self.allocations[client] = alloc
        self.usage.add(pending.user_id)
        self._schedule(alloc.expires, 0, client, None)
        attrs: dict[str, Any] = {
            "XOR-RELAYED-ADDRESS": relay,
            "LIFETIME": pending.lifetime_s,
            "XOR-MAPPED-ADDRESS": client,
        }
        if reserved_port:
            token = self._reservation_token()
            expires = now + RESERVATION_LIFETIME_S
            self.reservations[token] = (reserved_port, expires)
            self._schedule(expires, 3, client, token)
            attrs["RESERVATION-TOKEN"] = token
        answer = codec.encode(
            Method.ALLOCATE,
            Class.RESPONSE,
            pending.transaction_id,
            attrs,
            key=pending.key,
            software=self.software,
        )
        self._remember(client, pending.transaction_id, answer, now)
        out.append(SendToClient(client, answer))
        out.append(AllocationCreated(client, pending.user_id, relay, pending.lifetime_s))
        return out

    def relay_failed(self, client: Address, now: float) -> list[Effect]:
        out: list[Effect] = []
        pending = self._pending.pop(client, None)
        if pending is None:
            return out
        answer = codec.error_response(
            Method.ALLOCATE,
            pending.transaction_id,
            508,
            "Insufficient Capacity",
            key=pending.key,
            software=self.software,
        )
        self._remember(client, pending.transaction_id, answer, now)
        out.append(SendToClient(client, answer))
        return out

    def client_closed(self, client: Address, now: float) -> list[Effect]:
        """A stream client went away: its allocation goes with it (RFC 8656 §3.1)."""
        out: list[Effect] = []
        self._pending.pop(client, None)
        alloc = self.allocations.get(client)
        if alloc is not None:
            self._delete(alloc, "closed", out)
        return out

    def tick(self, now: float) -> list[Effect]:
        """Expire allocations, permissions and channels whose deadline has passed."""
        out: list[Effect] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, kind, client, item = heapq.heappop(heap)
            if kind == 3:
                held = self.reservations.get(item)
                if held is not None and held[1] <= now:
                    del self.reservations[item]
                    out.append(ReleasePort(held[0]))
                continue
            alloc = self.allocations.get(client)
            if alloc is None:
                continue
            if kind == 0:
                if alloc.expires <= now:
                    self._delete(alloc, "expired", out)
            elif kind == 1:
                expires = alloc.permissions.get(item)
                if expires is not None and expires <= now:
                    del alloc.permissions[item]
                    self._sync_routes(alloc, now, out)
            else:
                channel = alloc.channels.get(item)
                if channel is not None and channel.expires <= now:
                    del alloc.channels[item]
                    alloc.peer_channels.pop(channel.peer, None)
                    if channel.routed:
                        channel.routed = False
                        out.append(ChannelRouteRemoved(client, channel.number, channel.peer))
        self._purge_cache(now)
        return out

    def close(self) -> list[Effect]:
        """Drop every allocation (listener removed or restarted)."""
        out: list[Effect] = []
        for alloc in list(self.allocations.values()):
            self._delete(alloc, "shutdown", out)
        for port, _expires in self.reservations.values():
            out.append(ReleasePort(port))
        self.reservations.clear()
        self._pending.clear()
        self._deadlines.clear()
        return out

    # ------------------------------------------------------------------ authentication

    def _authenticate(
        self, decoded: codec.Decoded, client: Address, now: float, out: list[Effect]
    ) -> _Request | None:
        """RFC 8489 §9.2.4 long-term credentials; returns None after answering a failure."""
        msg, peers = decoded.message, decoded.peers
        auth = self.policies.authenticator
        if not auth.enabled:
            self._reply_error(out, client, msg, 400, "TURN is disabled (auth type none)", now)
            return None
        attrs = msg.attributes
        if "MESSAGE-INTEGRITY" not in attrs:
            self._challenge(out, client, msg, 401, "Unauthorized", now)
            return None
        username = attrs.get("USERNAME")
        nonce = attrs.get("NONCE")
        if username is None or nonce is None or "REALM" not in attrs:
            self._reply_error(out, client, msg, 400, "Missing USERNAME, REALM or NONCE", now)
            return None
        if not self._nonces.valid(nonce, now):
            self._challenge(out, client, msg, 438, "Stale Nonce", now)
            return None
        credential = auth.lookup(username, now + self.clock_offset_s)
        if credential is None or not codec.check_integrity(msg, credential.key):
            self._challenge(out, client, msg, 401, "Unauthorized", now)
            return None
        return _Request(msg, client, credential.user_id, credential.key, peers)

    def _challenge(
        self,
        out: list[Effect],
        client: Address,
        msg: codec.Message,
        code: int,
        reason: str,
        now: float,
    ) -> None:
        # Challenges are not cached: a retransmission gets a fresh nonce, which is harmless.
        self._send(
            out,
            client,
            codec.error_response(
                msg.message_method,
                msg.transaction_id,
                code,
                reason,
                extra={
                    "REALM": self.policies.authenticator.realm,
                    "NONCE": self._nonces.issue(now),
                },
                software=self.software,
            ),
        )

    # ------------------------------------------------------------------ methods

    def _allocate(self, req: _Request, now: float, out: list[Effect]) -> None:
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
        if transport & 0xFF000000 != codec.TRANSPORT_UDP:
            self._fail(req, 442, "Unsupported Transport Protocol", now, out)
            return
        reserved_port = 0
        if "RESERVATION-TOKEN" in attrs:
            if "EVEN-PORT" in attrs or "REQUESTED-ADDRESS-FAMILY" in attrs:
                self._fail(req, 400, "RESERVATION-TOKEN with EVEN-PORT or family", now, out)
                return
            held = self.reservations.get(attrs["RESERVATION-TOKEN"])
            if held is None or held[1] <= now:
                self._fail(req, 508, "Insufficient Capacity (no such reservation)", now, out)
                return
        family_code = attrs.get("REQUESTED-ADDRESS-FAMILY")
        if family_code is not None:
            wanted = {codec.FAMILY_IPV4: 4, codec.FAMILY_IPV6: 6}.get(family_code)
            if wanted is None:
                self._fail(req, 440, "Address Family not Supported", now, out)
                return
            if wanted != self.relay_family:
                self._fail(req, 440, "Address Family not Supported", now, out)
                return
        if not self.policies.quota.allows(req.user_id, self.usage.counts):
            self._fail(req, 486, "Allocation Quota Reached", now, out)
            return
        if "RESERVATION-TOKEN" in attrs:
            reserved_port = self.reservations.pop(attrs["RESERVATION-TOKEN"])[0]
        even = attrs.get("EVEN-PORT")
        reserve_next = even is not None and bool(even & 0x80)
        self._pending[client] = _Pending(
            msg.transaction_id,
            req.user_id,
            req.key,
            _lifetime(attrs.get("LIFETIME")),
            self.relay_family,
            reserve_next,
        )
        out.append(
            OpenRelay(client, self.relay_family, even is not None, reserve_next, reserved_port)
        )

    def _refresh(self, req: _Request, now: float, out: list[Effect]) -> None:
        """RFC 8656 §7.3: LIFETIME 0 deletes, otherwise the allocation is extended."""
        alloc = self._owned_allocation(req, now, out)
        if alloc is None:
            return
        attrs = req.message.attributes
        family_code = attrs.get("REQUESTED-ADDRESS-FAMILY")
        if family_code is not None and {1: 4, 2: 6}.get(family_code) != alloc.family:
            self._fail(req, 443, "Peer Address Family Mismatch", now, out)
            return
        requested = attrs.get("LIFETIME")
        if requested == 0:
            self._delete(alloc, "refresh", out)
            lifetime = 0
        else:
            lifetime = _lifetime(requested)
            alloc.expires = now + lifetime
            self._schedule(alloc.expires, 0, alloc.client, None)
        self._succeed(req, {"LIFETIME": lifetime}, now, out)

    def _create_permission(self, req: _Request, now: float, out: list[Effect]) -> None:
        """RFC 8656 §9: every XOR-PEER-ADDRESS must be acceptable or nothing is installed."""
        alloc = self._owned_allocation(req, now, out)
        if alloc is None:
            return
        peers = req.peers
        if not peers:
            self._fail(req, 400, "Missing XOR-PEER-ADDRESS", now, out)
            return
        for ip, _port in peers:
            if _family_of(ip) != alloc.family:
                self._fail(req, 443, "Peer Address Family Mismatch", now, out)
                return
            if not self.policies.peers.admits_ip(ip):
                self._fail(req, 403, "Forbidden (peer not admitted by any route)", now, out)
                return
        for ip, _port in peers:
            self._install_permission(alloc, ip, now)
        self._sync_routes(alloc, now, out)
        self._succeed(req, {}, now, out)

    def _channel_bind(self, req: _Request, now: float, out: list[Effect]) -> None:
        """RFC 8656 §11.2: bind or refresh; a channel and a peer are bound one to one."""
        alloc = self._owned_allocation(req, now, out)
        if alloc is None:
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
        peer = (peer[0], peer[1])
        if _family_of(peer[0]) != alloc.family:
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
        self._schedule(channel.expires, 2, alloc.client, number)
        self._install_permission(alloc, peer[0], now)
        self._sync_routes(alloc, now, out)
        self._succeed(req, {}, now, out)

    def _send_indication(
        self, msg: codec.Message, client: Address, now: float, out: list[Effect]
    ) -> None:
        """RFC 8656 §10.2: forward DATA if a permission exists; otherwise drop silently."""
        peer = msg.attributes.get("XOR-PEER-ADDRESS")
        data = msg.attributes.get("DATA")
        if peer is None or data is None:
            self.stats_dropped += 1
            return
        self._relay_to_peer(client, (peer[0], peer[1]), data, now, out)

    def _relay_to_peer(
        self, client: Address, peer: Address, data: bytes, now: float, out: list[Effect]
    ) -> None:
        alloc = self.allocations.get(client)
        expires = alloc.permissions.get(peer[0]) if alloc is not None else None
        if expires is None or expires <= now or not self.policies.peers.admits(peer[0], peer[1]):
            self.stats_dropped += 1
            return
        out.append(SendToPeer(client, peer, data))

    def _channel_data(self, data: bytes, client: Address, out: list[Effect]) -> None:
        parsed = codec.parse_channel_data(data)
        alloc = self.allocations.get(client)
        if parsed is None or alloc is None:
            self.stats_dropped += 1
            return
        channel = alloc.channels.get(parsed[0])
        if channel is None or not channel.routed:
            self.stats_dropped += 1
            return
        out.append(SendToPeer(client, channel.peer, parsed[1]))

    # ------------------------------------------------------------------ helpers

    def _owned_allocation(self, req: _Request, now: float, out: list[Effect]) -> Allocation | None:
        """The client's allocation if this user made it (upstream §3.5), else answer 437."""
        alloc = self.allocations.get(req.client)
        if alloc is None or alloc.user_id != req.user_id or alloc.expires <= now:
            self._fail(req, 437, "Allocation Mismatch", now, out)
            return None
        return alloc

    def _install_permission(self, alloc: Allocation, ip: str, now: float) -> None:
        expires = now + PERMISSION_LIFETIME_S
        alloc.permissions[ip] = expires
        self._schedule(expires, 1, alloc.client, ip)

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
                route = ChannelRouteAdded if wanted else ChannelRouteRemoved
                out.append(route(alloc.client, channel.number, channel.peer))

    def _delete(self, alloc: Allocation, reason: str, out: list[Effect]) -> None:
        for channel in alloc.channels.values():
            if channel.routed:
                channel.routed = False
                out.append(ChannelRouteRemoved(alloc.client, channel.number, channel.peer))
        del self.allocations[alloc.client]
        self.usage.remove(alloc.user_id)
        self._compact_deadlines()
        out.append(CloseRelay(alloc.client))
        out.append(AllocationDeleted(alloc.client, alloc.user_id, reason))

    def _compact_deadlines(self) -> None:
        """Drop heap entries of deleted allocations once they dominate (heavy churn)."""
        heap = self._deadlines
        if len(heap) > 1024 and len(heap) > 16 * (len(self.allocations) + len(self.reservations)):
            live = self.allocations
            heap[:] = [e for e in heap if e[2] == 3 or e[3] in live]  # in place: tick() holds it
            heapq.heapify(heap)

    def _reservation_token(self) -> bytes:
        """8 opaque bytes (RFC 8656 §14.9), unguessable without the engine's secret."""
        self._seq += 1
        return hmac.new(self._token_key, self._seq.to_bytes(8, "big"), hashlib.sha256).digest()[:8]

    def _schedule(self, deadline: float, kind: int, client: Address, item: Any) -> None:
        self._seq += 1
        heapq.heappush(self._deadlines, (deadline, self._seq, kind, client, item))

    def _succeed(self, req: _Request, attrs: dict[str, Any], now: float, out: list[Effect]) -> None:
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

    def _fail(self, req: _Request, code: int, reason: str, now: float, out: list[Effect]) -> None:
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
        self._remember(client, msg.transaction_id, answer, now)
        out.append(SendToClient(client, answer))

    def _send(self, out: list[Effect], client: Address, data: bytes) -> None:
        out.append(SendToClient(client, data))

    def _remember(self, client: Address, tid: bytes, answer: bytes, now: float) -> None:
        self._purge_cache(now)
        if len(self._cache) >= RETRANSMIT_CACHE_MAX:
            self._cache.pop(next(iter(self._cache)))
        self._cache[(client, tid)] = (now + RETRANSMIT_CACHE_S, answer)

    def _purge_cache(self, now: float) -> None:
        cache = self._cache
        while cache:
            key = next(iter(cache))
            if cache[key][0] > now:
                break
            del cache[key]


def _transaction_id(engine: TurnEngine) -> bytes:
    """Indications need a transaction id; uniqueness is all that matters (RFC 8489 §6)."""
    engine._seq += 1
    return engine._seq.to_bytes(12, "big")
