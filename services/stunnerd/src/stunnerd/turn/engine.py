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
* The relay handshake, client departure, `tick` and `close` live in `lifecycle.py`; the request
  handlers in `methods.py`. `TurnEngine` inherits both and keeps dispatch and peer traffic here.
* Policies (auth, peers, quota) are swapped by `set_policies`; routes are re-evaluated at once and
  existing allocations survive. Auth changes apply at the next authenticated request.

Deliberate differences from upstream (pion): a peer the policy refuses gets 403 on CreatePermission
and ChannelBind; a wrong username or password gets 401 (RFC 8489 §9.2.4) rather than 400; the user
quota is enforced (486). EVEN-PORT is honoured; with its R bit the next port is held for
`RESERVATION_LIFETIME_S` and a RESERVATION-TOKEN returned (RFC 8656 §7.2); unknown tokens get 508.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from stunnerd.turn import codec, precheck
from stunnerd.turn.allocation import (
    Allocation,
    family_of,
    unmapped,
    unmapped_address,
)
from stunnerd.turn.auth import AuthenticatedRequest, Gatekeeper, Refusal
from stunnerd.turn.codec import Class, Method, TcpMethod
from stunnerd.turn.effects import Address, Effect, SendToClient, SendToPeer
from stunnerd.turn.guard import ChallengeBudget, RequestLimits
from stunnerd.turn.lifecycle import RelayLifecycle
from stunnerd.turn.methods import Pending
from stunnerd.turn.policies import (
    AllowAllPeers,
    Authenticator,
    NoAuthenticator,
    NonceMint,
    PeerPolicy,
    UserQuota,
    UserUsage,
)
from stunnerd.turn.refusals import RefusalLog
from stunnerd.turn.reservations import Reservations
from stunnerd.turn.retransmit import RetransmitCache
from stunnerd.turn.tcp_connections import MAX_CONNECTIONS_PER_ALLOCATION, PeerConnections
from stunnerd.turn.timers import Deadlines

SOFTWARE = "stunnerd"

_AUTHENTICATED_METHODS = frozenset(
    {
        Method.ALLOCATE,
        Method.REFRESH,
        Method.CREATE_PERMISSION,
        Method.CHANNEL_BIND,
        TcpMethod.CONNECT,
        TcpMethod.CONNECTION_BIND,
    }
)


@dataclass(frozen=True, slots=True)
class Policies:
    authenticator: Authenticator
    peers: PeerPolicy
    quota: UserQuota


class TurnEngine(RelayLifecycle):
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
        self.relay_ips = {self.relay_family: relay_ip}
        if other_relay_ip:
            ipaddress.ip_address(other_relay_ip)
            if family_of(other_relay_ip) == self.relay_family:
                raise ValueError(f"{other_relay_ip} is not of the other family than {relay_ip}")
            self.relay_ips[family_of(other_relay_ip)] = other_relay_ip
        self.stream = stream
        self.tcp_relays = tcp_relays  # RFC 6062 allocations (stream listeners only)
        self.max_tcp_connections = max_tcp_connections  # peer connections per TCP allocation
        self.clock_offset_s = clock_offset_s  # unix time = now + offset (ephemeral expiry)
        self.software = software
        self.policies = policies or Policies(NoAuthenticator(), AllowAllPeers(), UserQuota())
        self.usage = usage if usage is not None else UserUsage()
        nonces = (
            NonceMint(nonce_secret)
            if nonce_lifetime_s is None
            else NonceMint(nonce_secret, nonce_lifetime_s)
        )
        self.limits = limits or RequestLimits()
        budget = ChallengeBudget(self.limits.challenge_rate_per_s, self.limits.challenge_burst)
        self._gatekeeper = Gatekeeper(nonces, budget, self.limits.max_attributes)
        self.allocations: dict[Address, Allocation] = {}
        self._pending: dict[Address, Pending] = {}
        self._cache = RetransmitCache()
        self._deadlines = Deadlines()
        self._reservations = Reservations(nonce_secret)
        self._tcp = PeerConnections()
        self._indications = 0  # transaction ids of Data indications
        self.stats_dropped = 0
        self.stats_challenges_suppressed = 0  # 401/438 not sent: the source was over budget
        self.refusals = RefusalLog()  # the edge names it after its listener

    # ------------------------------------------------------------------ public API

    @property
    def allocation_count(self) -> int:
        return len(self.allocations)

    def set_policies(self, policies: Policies, now: float) -> list[Effect]:
        """Swap auth/peer/quota policies in place; re-evaluate channel routes for live traffic.

        Credentials the new authenticator no longer grants (the user gone, the password or the
        TURN REST secret changed) apply to an allocation's next request, as upstream does: it
        relays until a Refresh fails and it expires. Meanwhile it is `revoked`: its channels
        leave the kernel offload at once (`ChannelRouteAdded(offload=False)`), and come back
        if a later config grants the credentials again (a rolled-back reconcile) or the client
        authenticates anew.
        """
        recheck = policies.authenticator != self.policies.authenticator
        self.policies = policies
        out: list[Effect] = []
        for alloc in self.allocations.values():
            if recheck:
                self._set_revoked(alloc, not self._still_authorized(alloc), out)
            self._sync_routes(alloc, now, out)
            if alloc.tcp:
                self._sync_tcp_connections(alloc.client, out)
        return out

    def _still_authorized(self, alloc: Allocation) -> bool:
        # Unix time 0: a TURN REST username's expiry bounds new requests, not a live allocation
        # (it ends when a Refresh is refused), so only the key and the user are compared here.
        found = self.policies.authenticator.lookup(alloc.username, 0.0)
        return found is not None and found.key == alloc.key and found.user_id == alloc.user_id

    @property
    def reservations(self) -> dict[bytes, tuple[int, float]]:
        """Held relay ports by RESERVATION-TOKEN: (port, expiry)."""
        return self._reservations.held

    def next_deadline(self) -> float | None:
        return self._deadlines.next()

    def handle_client(self, data: bytes, client: Address, now: float) -> list[Effect]:
        """One datagram (UDP, DTLS) or one de-framed message (TCP, TLS) from a client.

        What a request costs before its credentials are proven is bounded: the header is checked
        in constant time, a request without MESSAGE-INTEGRITY is challenged without reading its
        attributes, and the full decode (aioice) runs only on authenticated requests, on Binding
        requests and on Send indications of clients that hold an allocation.
        """
        out: list[Effect] = []
        if not data:
            return out
        first = data[0]
        if 0x40 <= first <= 0x7F:
            self._channel_data(data, client, out)
            return out
        try:
            head = precheck.header(data, self.limits.max_message_bytes)
        except codec.StunDecodeError:
            self.stats_dropped += 1
            return out
        klass = head.msg_type & 0x0110
        if klass == Class.INDICATION:
            if head.method == Method.SEND and client in self.allocations:
                self._indication(data, client, now, out)
            else:
                self.stats_dropped += 1
            return out
        if klass != Class.REQUEST:
            return out  # responses are not for a server
        cached = self._cache.get(client, head.transaction_id, now)
        if cached is not None:
            out.append(SendToClient(client, cached))
            return out
        method = head.method
        try:
            if method == Method.BINDING:
                self._binding(data, head, client, out)
            elif method not in _AUTHENTICATED_METHODS:
                self._refuse(out, client, head, 400, "Bad Request")
            else:
                self._authenticated(data, head, client, now, out)
        except codec.StunBadRequestError as exc:
            self._refuse(out, client, head, 400, str(exc))
        except codec.StunDecodeError:
            self.stats_dropped += 1
        return out

    def _binding(
        self, data: bytes, head: precheck.Header, client: Address, out: list[Effect]
    ) -> None:
        """RFC 8489 §6.3.1: the one request anyone may make; its attributes are only scanned."""
        found = precheck.scan(data, head, self.limits.max_attributes)
        if found.unknown_required:
            self._unknown_attributes(out, client, head, found.unknown_required)
            return
        self._send(
            out,
            client,
            codec.encode(
                Method.BINDING,
                Class.RESPONSE,
                head.transaction_id,
                {"XOR-MAPPED-ADDRESS": unmapped_address(client)},
                software=self.software,
            ),
        )

    def _authenticated(
        self, data: bytes, head: precheck.Header, client: Address, now: float, out: list[Effect]
    ) -> None:
        """Authenticate on the raw bytes (RFC 8489 §9.2.4), then decode and dispatch."""
        auth = self.policies.authenticator
        checked = self._gatekeeper.check(data, head, now, now + self.clock_offset_s, auth)
        if isinstance(checked, Refusal):
            if checked.detail or not checked.challenge:
                self.refusals.refused(
                    now,
                    client,
                    method_name(head.method),
                    checked.code,
                    checked.reason,
                    checked.user,
                    checked.detail,
                )
            if checked.challenge:
                answer = self._gatekeeper.challenge(head, checked, client, now, auth, self.software)
                if answer is None:
                    self.stats_challenges_suppressed += 1
                else:
                    self._send(out, client, answer)
            else:
                self._refuse(out, client, head, checked.code, checked.reason)
            return
        decoded = codec.decode(data)
        if decoded.unknown_required:
            # RFC 8489 §6.3.1: unknown comprehension-required attributes, after authentication
            self._unknown_attributes(out, client, head, decoded.unknown_required)
            return
        request = AuthenticatedRequest(
            decoded.message, client, checked.user_id, checked.key, decoded.peers, checked.username
        )
        handlers: dict[int, Callable[[AuthenticatedRequest, float, list[Effect]], None]] = {
            Method.ALLOCATE: self._allocate,
            Method.REFRESH: self._refresh,
            Method.CREATE_PERMISSION: self._create_permission,
            Method.CHANNEL_BIND: self._channel_bind,
            TcpMethod.CONNECT: self._connect,
            TcpMethod.CONNECTION_BIND: self._connection_bind,
        }
        handler = handlers[head.method]
        handler(request, now, out)

    def _fail(
        self, req: AuthenticatedRequest, code: int, reason: str, now: float, out: list[Effect]
    ) -> None:
        """Every error answer to an authenticated request: logged (rate-limited) and counted."""
        detail = self._forbidden_detail(req) if code == 403 else ""
        self.refusals.refused(
            now,
            req.client,
            method_name(req.message.message_method),
            code,
            reason,
            req.username or req.user_id,
            detail,
        )
        super()._fail(req, code, reason, now, out)

    def _forbidden_detail(self, req: AuthenticatedRequest) -> str:
        """Which peer a 403 was about and which routes were considered (for the log)."""
        peers = self.policies.peers
        refused = [p for p in req.peers if not peers.admits(unmapped(p[0]), p[1])]
        shown = refused or list(req.peers)
        where = ", ".join(
            f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            for ip, port in ((unmapped(p[0]), p[1]) for p in shown)
        )
        clusters = getattr(peers, "clusters", None)
        if clusters is None:
            routes = type(peers).__name__
        elif not clusters:
            routes = "none: the listener has no route"
        else:
            routes = "; ".join(
                f"{c.name} ({c.protocol}: "
                f"{', '.join([*map(str, c.endpoints), *c.dns_names]) or 'no endpoints'})"
                for c in clusters
            )
        guard = getattr(getattr(peers, "protected", None), "guard_of", None)
        ranges = sorted(
            {str(net) for ip, _ in shown if guard is not None and (net := guard(unmapped(ip)))}
        )
        protected = (
            f"; the peer is in protected range {', '.join(ranges)}: a route must name it exactly"
            if ranges
            else ""
        )
        peer = where or "none"
        return f"peer {peer} is admitted by no route (routes considered: {routes}){protected}"

    def _indication(self, data: bytes, client: Address, now: float, out: list[Effect]) -> None:
        """A Send indication from a client with an allocation (RFC 8656 §10.2)."""
        fast = codec.parse_send_indication(data)
        if fast is not None:
            self._relay_to_peer(client, fast[0], fast[1], now, out)
            return
        try:
            decoded = codec.decode(data)
        except ValueError:  # StunDecodeError and StunBadRequestError: indications get no answer
            self.stats_dropped += 1
            return
        if not decoded.unknown_required:
            self._send_indication(decoded.message, client, now, out)

    def _refuse(
        self, out: list[Effect], client: Address, head: precheck.Header, code: int, reason: str
    ) -> None:
        """A short error answer to a request refused before authentication; not cached."""
        self._send(
            out,
            client,
            codec.error_response(
                head.method, head.transaction_id, code, reason, software=self.software
            ),
        )

    def _unknown_attributes(
        self, out: list[Effect], client: Address, head: precheck.Header, types: tuple[int, ...]
    ) -> None:
        self._send(
            out,
            client,
            codec.error_response(
                head.method,
                head.transaction_id,
                420,
                "Unknown Attribute",
                extra={"UNKNOWN-ATTRIBUTES": types},
                software=self.software,
            ),
        )

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
        if ":" in peer[0]:
            peer = (unmapped(peer[0]), peer[1])
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


def method_name(method: int) -> str:
    """``ALLOCATE``, ``CREATE_PERMISSION``, ``CONNECT``, ... for a STUN method number."""
    for enum in (Method, TcpMethod):
        try:
            return str(enum(method).name)
        except ValueError:
            continue
    return f"method 0x{method:03x}"


def _transaction_id(engine: TurnEngine) -> bytes:
    return engine._next_indication_id()
