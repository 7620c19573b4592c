"""The TURN server state machine for one listener (RFC 8656 over RFC 8489), with no I/O at all.

Bytes, the client's transport address and `now` (the edge's monotonic clock, seconds) go in; a list
of effects comes out. One engine serves one listener: on UDP the client address is the 5-tuple, on
stream transports the edge gives every connection its own address and calls `client_closed`.

`TurnEngine` holds explicit state objects and dispatches to them:

* `table` (`AllocationTable`): every allocation and its state, PENDING → ACTIVE ⇄ REVOKED →
  DELETED, with the deadline heap and the held ports; its theory of operation is in `table.py`.
  Allocation is two-phase: an authenticated Allocate yields `OpenRelay`, and the edge's
  `relay_opened(client, port, now)` (or `relay_failed`) produces the answer.
* `connections` (`PeerConnections`): the RFC 6062 peer connections of TCP allocations.
* `requests` (`Dispatcher`, `dispatch.py`): the request path. The `Gatekeeper` (nonces, the
  per-source challenge budget, the credential check) runs on the raw bytes, then the method's
  handler; the `refusals` log says why a request was refused.
* `answers` (`Answerer`): the one answer path. A refusal is a `TurnError` raised by a check and
  answered by the dispatcher; an answer to an authenticated request is signed and cached per
  (client, transaction id) for `RETRANSMIT_CACHE_S`, so a retransmission gets the same bytes
  (RFC 8489 §6.3.1), even after a Refresh deleted the allocation.

The request handlers are methods of `AllocationHandlers` (`methods.py`) and `TcpRelayHandlers`
(`tcp_relay.py`); the relay of data both ways and the public API are here. Lifetimes sit in one
heap: `next_deadline()` tells the edge when to call `tick(now)`.

ChannelData is the hot path. A channel is *routed* while it is bound, its peer IP has a live
permission and the peer policy admits the peer's address; the engine announces route changes
(`ChannelRouteAdded/Removed`) so the edge can forward ChannelData both ways without calling in.
`handle_client` still forwards ChannelData itself for edges that do not keep a fast path.

Policies (auth, peers, quota) are swapped by `set_policies`; routes are re-evaluated at once and
existing allocations survive. Auth changes apply at the next authenticated request.

Deliberate differences from upstream (pion): a peer the policy refuses gets 403 on CreatePermission
and ChannelBind; a wrong username or password gets 401 (RFC 8489 §9.2.4) rather than 400; the user
quota is enforced (486). EVEN-PORT is honoured; with its R bit the next port is held for
`RESERVATION_LIFETIME_S` and a RESERVATION-TOKEN returned (RFC 8656 §7.2); unknown tokens get 508.
"""

from __future__ import annotations

import ipaddress

from stunnerd.turn import codec, precheck
from stunnerd.turn.allocation import (
    Allocation,
    AllocationState,
    family_of,
    unmapped,
)
from stunnerd.turn.answers import Answerer
from stunnerd.turn.auth import Gatekeeper
from stunnerd.turn.codec import Class, Method, TcpMethod
from stunnerd.turn.dispatch import Dispatcher
from stunnerd.turn.effects import Address, Effect, SendToClient, SendToPeer
from stunnerd.turn.errors import TurnError
from stunnerd.turn.guard import ChallengeBudget, FailedAuthBudget, RequestLimits, SourceBudget
from stunnerd.turn.methods import AllocationHandlers
from stunnerd.turn.policies import (
    AllowAllPeers,
    NoAuthenticator,
    NonceMint,
    Policies,
    UserQuota,
    UserUsage,
)
from stunnerd.turn.refusals import RefusalLog, method_name
from stunnerd.turn.reservations import Reservations
from stunnerd.turn.table import AllocationTable
from stunnerd.turn.tcp_connections import MAX_CONNECTIONS_PER_ALLOCATION, PeerConnections
from stunnerd.turn.tcp_relay import TcpRelayHandlers
from stunnerd.turn.timers import DeadlineKind

__all__ = ["SOFTWARE", "Policies", "TurnEngine", "method_name"]

SOFTWARE = "stunnerd"


class TurnEngine:
    """One listener's TURN state. All methods are synchronous and return effects."""

    def __init__(
        self,
        *,
        relay_ip: str,
        nonce_secret: bytes,
        other_relay_ip: str = "",
        policies: Policies | None = None,
        usage: UserUsage | None = None,
        stream: bool = False,
        clock_offset_s: float = 0.0,
        software: str | None = SOFTWARE,
        nonce_lifetime_s: float | None = None,
        limits: RequestLimits | None = None,
        tcp_relays: bool = True,
        max_tcp_connections: int = MAX_CONNECTIONS_PER_ALLOCATION,
    ) -> None:
        ipaddress.ip_address(relay_ip)  # fail early on a bad advertised address
        self.relay_ip = relay_ip
        self.relay_family = family_of(relay_ip)
        # Relay addresses by family: the listener's own, and one of the other family if the
        # server has one (REQUESTED-ADDRESS-FAMILY and dual allocations, RFC 8656 §7.2).
        relay_ips = {self.relay_family: relay_ip}
        if other_relay_ip:
            ipaddress.ip_address(other_relay_ip)
            if family_of(other_relay_ip) == self.relay_family:
                raise ValueError(f"{other_relay_ip} is not of the other family than {relay_ip}")
            relay_ips[family_of(other_relay_ip)] = other_relay_ip
        self.stream = stream
        self.software = software
        self.policies = policies or Policies(NoAuthenticator(), AllowAllPeers(), UserQuota())
        self.usage = usage if usage is not None else UserUsage()
        self.limits = limits or RequestLimits()
        nonces = (
            NonceMint(nonce_secret)
            if nonce_lifetime_s is None
            else NonceMint(nonce_secret, nonce_lifetime_s)
        )
        self.refusals = RefusalLog()  # the edge names it after its listener
        self.answers = Answerer(software)
        self.connections = PeerConnections()
        self.table = AllocationTable(
            relay_ips, self.usage, Reservations(nonce_secret), self.connections
        )
        self.allocations: dict[Address, Allocation] = self.table.active  # ACTIVE and REVOKED
        self._udp = AllocationHandlers(
            self.table,
            self.answers,
            relay_family=self.relay_family,
            stream=stream,
            tcp_relays=tcp_relays,
            max_permissions=self.limits.max_permissions_per_allocation,
            max_channels=self.limits.max_channels_per_allocation,
        )
        self._tcp = TcpRelayHandlers(
            self.table,
            self.answers,
            stream=stream,
            max_connections=max_tcp_connections,
            refusals=self.refusals,
        )
        budget = ChallengeBudget(self.limits.challenge_rate_per_s, self.limits.challenge_burst)
        self.requests = Dispatcher(
            self.answers,
            Gatekeeper(nonces, budget, self.limits.max_attributes, FailedAuthBudget(self.limits)),
            self.refusals,
            {
                Method.ALLOCATE: self._udp.allocate,
                Method.REFRESH: self._udp.refresh,
                Method.CREATE_PERMISSION: self._udp.create_permission,
                Method.CHANNEL_BIND: self._udp.channel_bind,
                TcpMethod.CONNECT: self._tcp.connect,
                TcpMethod.CONNECTION_BIND: self._tcp.connection_bind,
            },
            max_attributes=self.limits.max_attributes,
            clock_offset_s=clock_offset_s,
        )
        self.stats_dropped = 0

    # ------------------------------------------------------------------ state, for the edge

    @property
    def allocation_count(self) -> int:
        return len(self.allocations)

    @property
    def tcp_connection_count(self) -> int:
        return len(self.connections)

    @property
    def reservations(self) -> dict[bytes, tuple[int, float]]:
        """Held relay ports by RESERVATION-TOKEN: (port, expiry)."""
        return self.table.reservations.held

    @property
    def max_tcp_connections(self) -> int:
        """Peer connections one TCP allocation may hold (RFC 6062)."""
        return self._tcp.max_connections

    @max_tcp_connections.setter
    def max_tcp_connections(self, value: int) -> None:
        self._tcp.max_connections = value

    @property
    def clock_offset_s(self) -> float:
        """Unix time = `now` + this offset (TURN REST usernames carry a unix expiry)."""
        return self.requests.clock_offset_s

    @clock_offset_s.setter
    def clock_offset_s(self, value: float) -> None:
        self.requests.clock_offset_s = value

    @property
    def stats_challenges_suppressed(self) -> int:
        """401/438 answers not sent: their source was over its challenge budget."""
        return self.requests.challenges_suppressed

    def challenge_template(self, now: float) -> bytes | None:
        """The 401 to an Allocate without credentials, nonce issued at `now`, transaction id
        zeroed (None: TURN is off): for the C relay to answer such requests with."""
        return self.requests.challenge_template(Method.ALLOCATE, self.policies.authenticator, now)

    def use_challenge_budget(self, budget: SourceBudget) -> None:
        """Spend challenges from `budget` (the C relay's, which answers some of them itself)."""
        self.requests.gate.budget = budget

    def count_suppressed_challenges(self, count: int) -> None:
        """Challenges the C relay did not send: their source was over budget."""
        self.requests.suppressed_elsewhere(count)

    def next_deadline(self) -> float | None:
        return self.table.deadlines.next()

    def set_policies(self, policies: Policies, now: float) -> list[Effect]:
        """Swap auth/peer/quota policies in place; re-evaluate channel routes for live traffic.

        Credentials the new authenticator no longer grants (the user gone, the password or the
        TURN REST secret changed) apply to an allocation's next request, as upstream does: it
        relays until a Refresh fails and it expires. Meanwhile it is REVOKED: its channels
        leave the kernel offload at once (`ChannelRouteAdded(offload=False)`), and come back
        if a later config grants the credentials again (a rolled-back reconcile) or the client
        authenticates anew.
        """
        recheck = policies.authenticator != self.policies.authenticator
        self.policies = policies
        out: list[Effect] = []
        for alloc in self.allocations.values():
            if recheck:
                self.table.set_revoked(alloc, not self._still_authorized(alloc), out)
            self.table.sync_routes(alloc, policies.peers, now, out)
            if alloc.tcp:
                self._tcp.sync(alloc.client, policies.peers, out)
        return out

    def _still_authorized(self, alloc: Allocation) -> bool:
        # Unix time 0: a TURN REST username's expiry bounds new requests, not a live allocation
        # (it ends when a Refresh is refused), so only the key and the user are compared here.
        found = self.policies.authenticator.lookup(alloc.username, 0.0)
        return found is not None and found.key == alloc.key and found.user_id == alloc.user_id

    # ------------------------------------------------------------------ from the client

    def handle_client(self, data: bytes, client: Address, now: float) -> list[Effect]:
        """One datagram (UDP, DTLS) or one de-framed message (TCP, TLS) from a client.

        What a request costs before its credentials are proven is bounded: the header is checked
        in constant time, a request without MESSAGE-INTEGRITY is challenged without reading its
        attributes, and the full decode (aioice) runs only on authenticated requests, on Binding
        requests and on Send indications of clients that hold an allocation.
        """
        if not data:
            return []
        if 0x40 <= data[0] <= 0x7F:
            return self._channel_data(data, client)
        out: list[Effect] = []
        try:
            head = precheck.header(data, self.limits.max_message_bytes)
        except codec.StunDecodeError as exc:
            self.stats_dropped += 1
            if isinstance(exc, precheck.MessageTooLargeError):
                self.refusals.limited("message_bytes")
            return out
        klass = head.msg_type & 0x0110
        if klass == Class.INDICATION:
            if head.method == Method.SEND and client in self.allocations:
                return self._indication(data, client, now)
            self.stats_dropped += 1
        elif klass == Class.REQUEST:
            try:
                self.requests.handle(data, head, client, self.policies, now, out)
            except codec.StunDecodeError:
                self.stats_dropped += 1
        return out  # responses are not for a server

    # ------------------------------------------------------------------ data, both ways

    def _channel_data(self, data: bytes, client: Address) -> list[Effect]:
        parsed = codec.parse_channel_data(data)
        alloc = self.allocations.get(client)
        if parsed is None or alloc is None:
            self.stats_dropped += 1
            return []
        channel = alloc.channels.get(parsed[0])
        if channel is None or not channel.routed:
            self.stats_dropped += 1
            return []
        return [SendToPeer(client, channel.peer, parsed[1])]

    def _indication(self, data: bytes, client: Address, now: float) -> list[Effect]:
        """A Send indication from a client with an allocation (RFC 8656 §10.2): DATA goes to
        the peer if a permission exists; otherwise it is dropped silently."""
        fast = codec.parse_send_indication(data)
        if fast is not None:
            return self._relay_to_peer(client, fast[0], fast[1], now)
        try:
            decoded = codec.decode(data)
        except ValueError:  # StunDecodeError and StunBadRequestError: indications get no answer
            self.stats_dropped += 1
            return []
        if decoded.unknown_required:
            return []
        peer = decoded.message.attributes.get("XOR-PEER-ADDRESS")
        payload = decoded.message.attributes.get("DATA")
        if peer is None or payload is None:
            self.stats_dropped += 1
            return []
        return self._relay_to_peer(client, (peer[0], peer[1]), payload, now)

    def _relay_to_peer(
        self, client: Address, peer: Address, data: bytes, now: float
    ) -> list[Effect]:
        if ":" in peer[0]:
            peer = (unmapped(peer[0]), peer[1])
        alloc = self.allocations.get(client)
        expires = alloc.permissions.get(peer[0]) if alloc is not None else None
        if expires is None or expires <= now or not self.policies.peers.admits(peer[0], peer[1]):
            self.stats_dropped += 1
            return []
        return [SendToPeer(client, peer, data)]

    def handle_peer(self, client: Address, peer: Address, data: bytes, now: float) -> list[Effect]:
        """A datagram from `peer` arrived on `client`'s relay (the edge's slow path)."""
        alloc = self.allocations.get(client)
        if alloc is None:
            return []
        ip, port = peer[0], peer[1]
        expires = alloc.permissions.get(ip)
        if expires is None or expires <= now or not self.policies.peers.admits(ip, port):
            self.stats_dropped += 1
            return []
        channel = alloc.peer_channels.get((ip, port))
        if channel is not None and channel.expires > now:
            frame = codec.channel_data(channel.number, data, stream=self.stream)
        else:
            frame = codec.data_indication((ip, port), data, self.answers.next_id())
        return [SendToClient(client, frame)]

    # ------------------------------------------------------------------ from the edge

    def relay_opened(
        self,
        client: Address,
        port: int,
        now: float,
        reserved_port: int = 0,
        additional_port: int = 0,
    ) -> list[Effect]:
        """The edge bound the relay socket for a pending Allocate: answer with success.

        `reserved_port` is the socket the edge holds for an EVEN-PORT request with the R bit;
        `additional_port` the IPv6 relay of a dual allocation (RFC 8656 §7.2).
        """
        return self._udp.relay_opened(client, port, now, reserved_port, additional_port)

    def relay_failed(
        self,
        client: Address,
        now: float,
        code: int = 508,
        reason: str = "Insufficient Capacity",
        limit: str = "",
    ) -> list[Effect]:
        """The edge could not give a pending Allocate its relay: answer `code` (508, or 486
        when the cluster-wide quota refused it: `limit` is then `user_quota`)."""
        if limit:
            self.refusals.limited(limit)
        return self._udp.relay_failed(client, now, TurnError(code, reason))

    def adopt(self, alloc: Allocation) -> bool:
        """Carry on an allocation another process made (a worker that died, a stunnerd that
        handed off); the edge holds its relay. False: the client already has one here."""
        return self.table.adopt(alloc)

    def announce(self, client: Address, now: float) -> list[Effect]:
        """The routes of an adopted allocation, once the edge has its relay open; its
        credentials are checked against the config in force (REVOKED where it no longer grants
        them)."""
        out: list[Effect] = []
        alloc = self.allocations.get(client)
        if alloc is not None:
            self.table.set_revoked(alloc, not self._still_authorized(alloc), out)
            self.table.sync_routes(alloc, self.policies.peers, now, out)
        return out

    def client_closed(self, client: Address, now: float) -> list[Effect]:
        """A stream client went away: its allocation goes with it (RFC 8656 §3.1)."""
        out: list[Effect] = []
        self.table.abort(client)
        alloc = self.allocations.get(client)
        if alloc is not None:
            self.table.delete(alloc, "closed", out)
        return out

    def peer_connected(self, connection_id: int, now: float) -> list[Effect]:
        """RFC 6062 §5.2: the edge's outgoing connection succeeded; answer the Connect."""
        return self._tcp.peer_connected(connection_id, now)

    def peer_connect_failed(self, connection_id: int, now: float) -> list[Effect]:
        """RFC 6062 §5.2: the edge could not connect to the peer: 447."""
        return self._tcp.peer_connect_failed(connection_id, now)

    def peer_arrived(self, client: Address, peer: Address, now: float) -> tuple[int, list[Effect]]:
        """RFC 6062 §5.3: a peer connected to `client`'s relayed address.

        Returns the new connection id (0: refused, close it) and the ConnectionAttempt.
        """
        return self._tcp.peer_arrived(client, peer, self.policies.peers, now)

    def peer_connection_closed(self, connection_id: int, now: float) -> list[Effect]:
        """The edge saw a peer connection (or its data connection) end: forget it."""
        return self._tcp.peer_connection_closed(connection_id, now)

    def tick(self, now: float) -> list[Effect]:
        """Expire allocations, permissions, channels, holds and connections whose time came."""
        out: list[Effect] = []
        table = self.table
        for kind, client, item in table.deadlines.due(now):
            if kind is DeadlineKind.RESERVATION:
                table.expire_reservation(item, now, out)
                continue
            alloc = self.allocations.get(client)
            if alloc is None:
                continue
            if kind is DeadlineKind.TCP_CONNECTION:
                self._tcp.expire(item, now, out)
            else:
                table.expire(kind, alloc, item, self.policies.peers, now, out)
        self.answers.cache.purge(now)
        return out

    def close(self) -> list[Effect]:
        """Drop every allocation (listener removed or restarted)."""
        out: list[Effect] = []
        self.table.close(out)
        return out

    def state_of(self, client: Address) -> AllocationState | None:
        """The state of `client`'s allocation (None: it has none)."""
        return self.table.state_of(client)
