"""The allocations of one listener, and the one place where an allocation changes state.

Theory of operation
-------------------
An allocation is keyed by its client's transport address (the 5-tuple: on UDP the client's
address, on stream transports the edge's name for the connection) and is in one of four states
(`AllocationState`)::

               relay_opened                 the config withdraws its credentials
    PENDING ───────────────> ACTIVE ─────────────────────────────────> REVOKED
       │                       │  <─────────────────────────────────    │
       │ relay_failed,         │   the config grants them again, or     │
       │ client gone,          │   the client authenticates anew        │
       │ listener closed       │                                        │
       v                       └──────────────────┬─────────────────────┘
    (aborted)                                     v  Refresh 0, expiry, client gone, shutdown
                                               DELETED

* PENDING: an authenticated Allocate passed every check and the edge was asked to open the relay
  socket (`OpenRelay`, RFC 8656 §7.2 in two phases). The request waits in `pending` as a `Pending`
  record; a retransmission is ignored, another Allocate from the client gets 437. Nothing relays
  and nothing expires: the edge always reports back (`relay_opened`, `relay_failed`), or the
  client goes first and the relay is closed when it opens.
* ACTIVE: in `active` (the engine's `allocations`), counted in the user's usage, its expiry in
  the deadline heap; permissions and channels are installed here, and a channel is *routed*
  while it is bound, its peer IP has a live permission and the peer policy admits the peer. Every
  route change is announced (`ChannelRouteAdded/Removed`) by `sync_routes` and only there.
* ACTIVE by adoption (None → ACTIVE, `adopt`): an allocation another process made and handed
  over with its relay socket (a worker that died, a stunnerd handing off); it arrives with its
  permissions and channels, none of them routed until `sync_routes` announces them.
* REVOKED: still in `active` and relaying, as upstream does, until a Refresh fails and it expires;
  its routed channels are announced again with `offload=False` so they leave the kernel fast path.
* DELETED: out of `active`; its routes are removed, its RFC 6062 peer connections closed, and
  the edge told (`CloseRelay`, `AllocationDeleted`). Nothing leaves DELETED.

Rules: the state of an allocation changes only in this module's `AllocationTable` methods; the
request handlers (`methods`, `tcp_relay`) ask for transitions and never set `state` themselves.
Deadline heap entries are checked against the current expiry when due (`expire`) and scheduled
again when it was extended, so a refresh pushes nothing (`timers.Deadlines`).
"""

from __future__ import annotations

from typing import Any

from stunnerd.turn.allocation import (
    CHANNEL_LIFETIME_S,
    PERMISSION_LIFETIME_S,
    Allocation,
    AllocationState,
    Channel,
    Pending,
)
from stunnerd.turn.auth import AuthenticatedRequest
from stunnerd.turn.effects import (
    Address,
    AllocationAborted,
    AllocationDeleted,
    ChannelRouteAdded,
    ChannelRouteRemoved,
    CloseRelay,
    Effect,
    ReleasePort,
)
from stunnerd.turn.errors import AllocationMismatchError
from stunnerd.turn.policies import PeerPolicy, UserUsage
from stunnerd.turn.reservations import Reservations
from stunnerd.turn.tcp_connections import PeerConnections
from stunnerd.turn.timers import DeadlineKind, Deadlines


class AllocationTable:
    """Every allocation of one listener by state, with the deadlines and holds they own."""

    __slots__ = (
        "active",
        "connections",
        "deadlines",
        "pending",
        "relay_ips",
        "reservations",
        "usage",
    )

    def __init__(
        self,
        relay_ips: dict[int, str],
        usage: UserUsage,
        reservations: Reservations,
        connections: PeerConnections,
    ) -> None:
        self.relay_ips = relay_ips  # family -> the advertised relay IP
        self.usage = usage  # shared by every listener of the process
        self.reservations = reservations
        self.connections = connections  # RFC 6062: closed with their allocation
        self.pending: dict[Address, Pending] = {}
        self.active: dict[Address, Allocation] = {}  # ACTIVE and REVOKED; never rebound
        self.deadlines = Deadlines()

    def state_of(self, client: Address) -> AllocationState | None:
        alloc = self.active.get(client)
        if alloc is not None:
            return alloc.state
        return AllocationState.PENDING if client in self.pending else None

    # ------------------------------------------------------------------ transitions

    def begin(self, client: Address, pending: Pending) -> None:
        """None → PENDING: the edge is asked for a relay (the caller checked it has none)."""
        self.pending[client] = pending

    def open(
        self, client: Address, port: int, now: float, reserved_port: int, additional_port: int
    ) -> tuple[Pending, Allocation] | None:
        """PENDING → ACTIVE on the relay the edge opened; None if the client went away."""
        pending = self.pending.pop(client, None)
        if pending is None:
            return None
        additional = None
        if pending.additional and additional_port:
            additional = (self.relay_ips[pending.additional], additional_port)
        alloc = Allocation(
            client,
            pending.user_id,
            pending.key,
            (self.relay_ips[pending.family], port),
            pending.family,
            now + pending.lifetime_s,
            pending.username,
            pending.tcp,
            additional,
        )
        self.active[client] = alloc
        self.usage.add(pending.user_id)
        self.deadlines.schedule(alloc.expires, DeadlineKind.ALLOCATION, client, None)
        return pending, alloc

    @staticmethod
    def orphaned(client: Address, reserved_port: int, out: list[Effect]) -> None:
        """A relay opened for an Allocate whose client went away meanwhile: close it."""
        out.append(CloseRelay(client))
        out.append(AllocationAborted(client))
        if reserved_port:
            out.append(ReleasePort(reserved_port))

    def adopt(self, alloc: Allocation) -> bool:
        """None → ACTIVE "adopted": an allocation made elsewhere, relay and all (False: the
        client has one here already). Its channels start unrouted: `sync_routes` announces them."""
        client = alloc.client
        if client in self.active or client in self.pending:
            return False
        alloc.state = AllocationState.ACTIVE
        self.active[client] = alloc
        self.usage.add(alloc.user_id)
        schedule = self.deadlines.schedule
        schedule(alloc.expires, DeadlineKind.ALLOCATION, client, None)
        for ip, expires in alloc.permissions.items():
            schedule(expires, DeadlineKind.PERMISSION, client, ip)
        for channel in alloc.channels.values():
            channel.routed = False
            alloc.peer_channels[channel.peer] = channel
            schedule(channel.expires, DeadlineKind.CHANNEL, client, channel.number)
        return True

    def abort(self, client: Address) -> Pending | None:
        """PENDING → gone, without a relay (the edge failed, the client left)."""
        return self.pending.pop(client, None)

    def set_revoked(self, alloc: Allocation, revoked: bool, out: list[Effect]) -> None:
        """ACTIVE ↔ REVOKED: tell the edge which of its routed channels may be offloaded."""
        state = AllocationState.REVOKED if revoked else AllocationState.ACTIVE
        if alloc.state is state or alloc.state is AllocationState.DELETED:
            return
        alloc.state = state
        for channel in alloc.channels.values():
            if channel.routed:
                out.append(
                    ChannelRouteAdded(alloc.client, channel.number, channel.peer, not revoked)
                )

    def delete(self, alloc: Allocation, reason: str, out: list[Effect]) -> None:
        """ACTIVE or REVOKED → DELETED: routes, peer connections and the relay go."""
        for channel in alloc.channels.values():
            if channel.routed:
                channel.routed = False
                out.append(ChannelRouteRemoved(alloc.client, channel.number, channel.peer))
        if alloc.tcp:
            self.connections.drop_allocation(alloc.client, out)
        alloc.state = AllocationState.DELETED
        del self.active[alloc.client]
        self.usage.remove(alloc.user_id)
        self.deadlines.compact(self.active, len(self.reservations))
        out.append(CloseRelay(alloc.client))
        out.append(AllocationDeleted(alloc.client, alloc.user_id, reason))

    def owned(self, req: AuthenticatedRequest, now: float, out: list[Effect]) -> Allocation:
        """The client's live allocation if this user made it (upstream §3.5), else 437.

        A REVOKED allocation the user authenticated to under the config in force is ACTIVE again,
        with the credentials it was granted now.
        """
        alloc = self.active.get(req.client)
        if alloc is None or alloc.user_id != req.user_id or alloc.expires <= now:
            raise AllocationMismatchError()
        if alloc.state is AllocationState.REVOKED:
            alloc.key, alloc.username = req.key, req.username
            self.set_revoked(alloc, False, out)
        return alloc

    def close(self, out: list[Effect]) -> None:
        """Every allocation → DELETED, every pending one aborted (the listener goes)."""
        for alloc in list(self.active.values()):
            self.delete(alloc, "shutdown", out)
        for port in self.reservations.release_all():
            out.append(ReleasePort(port))
        self.pending.clear()
        self.connections.clear()
        self.deadlines.clear()

    # ------------------------------------------------------------------ what an allocation holds

    def refresh(self, alloc: Allocation, lifetime_s: int, now: float) -> None:
        alloc.expires = now + lifetime_s
        self.deadlines.schedule(alloc.expires, DeadlineKind.ALLOCATION, alloc.client, None)

    def install_permission(self, alloc: Allocation, ip: str, now: float) -> None:
        expires = now + PERMISSION_LIFETIME_S
        alloc.permissions[ip] = expires
        self.deadlines.schedule(expires, DeadlineKind.PERMISSION, alloc.client, ip)

    def bind_channel(self, alloc: Allocation, number: int, peer: Address, now: float) -> None:
        """Bind `number` to `peer` or refresh the binding, with a permission for the peer."""
        channel = alloc.channels.get(number) or Channel(number, peer, 0.0)
        channel.expires = now + CHANNEL_LIFETIME_S
        alloc.channels[number] = channel
        alloc.peer_channels[peer] = channel
        self.deadlines.schedule(channel.expires, DeadlineKind.CHANNEL, alloc.client, number)
        self.install_permission(alloc, peer[0], now)

    def hold_port(self, client: Address, port: int, now: float) -> bytes:
        """EVEN-PORT's R bit: hold the next port under a RESERVATION-TOKEN (RFC 8656 §7.2)."""
        token, expires = self.reservations.hold(port, now)
        self.deadlines.schedule(expires, DeadlineKind.RESERVATION, client, token)
        return token

    def sync_routes(
        self, alloc: Allocation, peers: PeerPolicy, now: float, out: list[Effect]
    ) -> None:
        """Announce every channel of `alloc` whose routed-ness changed."""
        offload = alloc.state is not AllocationState.REVOKED
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
                        ChannelRouteAdded(alloc.client, channel.number, channel.peer, offload)
                    )
                else:
                    out.append(ChannelRouteRemoved(alloc.client, channel.number, channel.peer))

    # ------------------------------------------------------------------ the clock

    def expire(
        self,
        kind: DeadlineKind,
        alloc: Allocation,
        item: Any,
        peers: PeerPolicy,
        now: float,
        out: list[Effect],
    ) -> None:
        """A due deadline of `alloc`: whatever has not been refreshed meanwhile ends."""
        client = alloc.client
        if kind is DeadlineKind.ALLOCATION:
            if alloc.expires <= now:
                self.delete(alloc, "expired", out)
            else:
                self.deadlines.schedule(alloc.expires, kind, client, None)
        elif kind is DeadlineKind.PERMISSION:
            expires = alloc.permissions.get(item)
            if expires is None:
                return
            if expires > now:
                self.deadlines.schedule(expires, kind, client, item)
                return
            del alloc.permissions[item]
            self.sync_routes(alloc, peers, now, out)
        elif kind is DeadlineKind.CHANNEL:
            channel = alloc.channels.get(item)
            if channel is not None and channel.expires > now:
                self.deadlines.schedule(channel.expires, kind, client, item)
            elif channel is not None:
                del alloc.channels[item]
                alloc.peer_channels.pop(channel.peer, None)
                if channel.routed:
                    channel.routed = False
                    out.append(ChannelRouteRemoved(alloc.client, channel.number, channel.peer))

    def expire_reservation(self, token: bytes, now: float, out: list[Effect]) -> None:
        port = self.reservations.expire(token, now)
        if port is not None:
            out.append(ReleasePort(port))
