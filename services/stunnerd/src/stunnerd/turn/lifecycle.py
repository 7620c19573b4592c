"""The relay handshake and the clock of a `TurnEngine`: the cold half of its public API.

The edge calls these outside the per-packet path: when it has bound (or failed to bind) the relay
socket of a pending Allocate, when a stream client goes away, at the deadlines the engine announces
(`tick`), and when the listener is removed. They live apart from `engine.py` so that the dispatch
and the ChannelData path stay short to read; `TurnEngine` inherits them unchanged.
"""

from __future__ import annotations

from typing import Any

from stunnerd.turn import codec
from stunnerd.turn.allocation import Allocation, unmapped_address
from stunnerd.turn.codec import FAMILY_IPV4, FAMILY_IPV6, Class, Method
from stunnerd.turn.effects import (
    Address,
    AllocationAborted,
    AllocationCreated,
    ChannelRouteRemoved,
    CloseRelay,
    Effect,
    ReleasePort,
    SendToClient,
)
from stunnerd.turn.tcp_relay import TcpRelayMethods
from stunnerd.turn.timers import DeadlineKind


class RelayLifecycle(TcpRelayMethods):
    """Relay handshake, client departure, expiry and shutdown; state set up by `TurnEngine`."""

    relay_ip: str
    relay_ips: dict[int, str]

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
        out: list[Effect] = []
        pending = self._pending.pop(client, None)
        if pending is None:
            out.append(CloseRelay(client))  # the client went away meanwhile
            out.append(AllocationAborted(client))
            if reserved_port:
                out.append(ReleasePort(reserved_port))
            return out
        relay = (self.relay_ips[pending.family], port)
        additional = None
        if pending.additional and additional_port:
            additional = (self.relay_ips[pending.additional], additional_port)
        alloc = Allocation(
            client,
            pending.user_id,
            pending.key,
            relay,
            pending.family,
            now + pending.lifetime_s,
            pending.username,
            pending.tcp,
            additional,
        )
        self.allocations[client] = alloc
        self.usage.add(pending.user_id)
        self._deadlines.schedule(alloc.expires, DeadlineKind.ALLOCATION, client, None)
        attrs: list[tuple[str, Any]] = [("XOR-RELAYED-ADDRESS", relay)]
        if additional is not None:
            attrs.append(("XOR-RELAYED-ADDRESS", additional))
        if pending.refused:
            code = FAMILY_IPV6 if pending.refused == 6 else FAMILY_IPV4
            attrs.append(("ADDRESS-ERROR-CODE", (code, 440, "Address Family not Supported")))
        attrs.append(("LIFETIME", pending.lifetime_s))
        attrs.append(("XOR-MAPPED-ADDRESS", unmapped_address(client)))
        if reserved_port:
            token, expires = self._reservations.hold(reserved_port, now)
            self._deadlines.schedule(expires, DeadlineKind.RESERVATION, client, token)
            attrs.append(("RESERVATION-TOKEN", token))
        answer = codec.encode(
            Method.ALLOCATE,
            Class.RESPONSE,
            pending.transaction_id,
            attrs,
            key=pending.key,
            software=self.software,
        )
        self._cache.remember(client, pending.transaction_id, answer, now)
        out.append(SendToClient(client, answer))
        out.append(
            AllocationCreated(client, pending.user_id, relay, pending.lifetime_s, additional)
        )
        return out

    def relay_failed(
        self, client: Address, now: float, code: int = 508, reason: str = "Insufficient Capacity"
    ) -> list[Effect]:
        """The edge could not give a pending Allocate its relay: answer `code` (508, or 486
        when the cluster-wide quota refused it)."""
        out: list[Effect] = []
        pending = self._pending.pop(client, None)
        if pending is None:
            return out
        answer = codec.error_response(
            Method.ALLOCATE,
            pending.transaction_id,
            code,
            reason,
            key=pending.key,
            software=self.software,
        )
        self._cache.remember(client, pending.transaction_id, answer, now)
        out.append(SendToClient(client, answer))
        out.append(AllocationAborted(client))
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
        for kind, client, item in self._deadlines.due(now):
            if kind is DeadlineKind.RESERVATION:
                port = self._reservations.expire(item, now)
                if port is not None:
                    out.append(ReleasePort(port))
                continue
            alloc = self.allocations.get(client)
            if alloc is None:
                continue
            if kind is DeadlineKind.TCP_CONNECTION:
                self._tcp_deadline(item, now, out)
            elif kind is DeadlineKind.ALLOCATION:
                if alloc.expires <= now:
                    self._delete(alloc, "expired", out)
            elif kind is DeadlineKind.PERMISSION:
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
        self._cache.purge(now)
        return out

    def close(self) -> list[Effect]:
        """Drop every allocation (listener removed or restarted)."""
        out: list[Effect] = []
        for alloc in list(self.allocations.values()):
            self._delete(alloc, "shutdown", out)
        for port in self._reservations.release_all():
            out.append(ReleasePort(port))
        self._pending.clear()
        self._tcp.clear()
        self._deadlines.clear()
        return out
