"""The asyncio edge's copy of the channel routes: the dicts its protocols read per datagram.

The listener protocols look up (client address, channel) in `client_routes` for ChannelData
from clients; each relay protocol looks up the peer's address in its own `peer_channels` for
datagrams from peers. Both are plain dicts keyed by the address tuples the sockets report, so a
routed datagram costs one lookup (`net.udp`, `net.stream`, `net.dtls`, `net.relay`).
"""

from __future__ import annotations

import socket

from stunnerd.route_table.table import (
    NOT_ROUTED,
    Address,
    ChannelRoute,
    RelayEnd,
    RouteView,
    Traffic,
    wire_forms,
)

ClientRoutes = dict[tuple[object, int], tuple[socket.socket, Address, Traffic]]
"""(client address, channel) → (relay socket, peer, the peer's cluster counters)."""


class PythonRoutes:
    """`RouteTable` over the listener's `client_routes` and the relays' `peer_channels`."""

    offload_only = False

    __slots__ = ("_relays", "client_routes")

    def __init__(self, client_routes: ClientRoutes) -> None:
        self.client_routes = client_routes
        self._relays: dict[tuple[Address, int], RelayEnd] = {}  # whose peer_channels we wrote

    def install(self, route: ChannelRoute) -> None:
        value = (route.relay.sock, route.peer, route.counts)
        for client in wire_forms(route.client):
            self.client_routes[(client, route.channel)] = value
        back = (route.channel, route.counts)
        channels = route.relay.peer_channels
        for peer in wire_forms(route.peer):
            channels[peer] = back
        self._relays[(route.client, route.channel)] = route.relay

    def remove(self, route: ChannelRoute) -> None:
        for client in wire_forms(route.client):
            self.client_routes.pop((client, route.channel), None)
        self._relays.pop((route.client, route.channel), None)
        channels = route.relay.peer_channels
        for peer in wire_forms(route.peer):
            channels.pop(peer, None)

    def clear(self) -> None:
        self.client_routes.clear()
        for relay in self._relays.values():
            relay.peer_channels.clear()
        self._relays.clear()

    def lookup(self, route: ChannelRoute) -> RouteView:
        hit = self.client_routes.get((route.client, route.channel))
        back = route.relay.peer_channels.get(route.peer)
        if hit is None and back is None:
            return NOT_ROUTED
        return RouteView(hit[1] if hit else None, back[0] if back else None)
