"""The engine's channel-route effects, carried out on every route table of one listener.

`ChannelRouteAdded` and `ChannelRouteRemoved` name a client, a channel and a peer; the listener
resolves them to the allocation's relay and the peer's cluster counters (`ChannelRoute`), and
`ChannelRoutes` hands the same route to each table: the asyncio edge's dicts always, the C
relay's and the kernel's where the listener runs them. It remembers the routes as installed, so
a removal reaches each table with what that table was given, and a policy change can move every
route to the counters of the cluster that now admits its peer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from stunnerd.route_table.table import Address, ChannelRoute, RelayEnd, RouteTable, Traffic
from stunnerd.turn import effects as fx

RelayOf = Callable[[Address, str], RelayEnd | None]
"""The relay of a client's allocation that serves peers of an IP's family, if any."""
CountsOf = Callable[[Address], Traffic]
"""The counters of the cluster that admits a peer."""


class ChannelRoutes:
    """A listener's routed channels and the tables that relay them."""

    __slots__ = ("counts_of", "relay_of", "routes", "tables")

    def __init__(self, relay_of: RelayOf, counts_of: CountsOf, *tables: RouteTable) -> None:
        self.relay_of = relay_of
        self.counts_of = counts_of
        self.tables: list[RouteTable] = list(tables)
        self.routes: dict[tuple[Address, int], ChannelRoute] = {}

    def add_table(self, table: RouteTable) -> None:
        """Another copy (started with the listener's socket): it gets every live route."""
        self.tables.append(table)
        for route in self.routes.values():
            table.install(route)

    def added(self, effect: fx.ChannelRouteAdded) -> None:
        relay = self.relay_of(effect.client, effect.peer[0])
        if relay is None or relay.transport is None:
            return  # the relay is gone or not open yet: nothing can relay this channel
        client = (effect.client[0], effect.client[1])
        route = ChannelRoute(
            client, effect.channel, effect.peer, relay, self.counts_of(effect.peer), effect.offload
        )
        self.routes[(client, effect.channel)] = route
        for table in self.tables:
            table.install(route)

    def removed(self, effect: fx.ChannelRouteRemoved) -> None:
        route = self.routes.pop(((effect.client[0], effect.client[1]), effect.channel), None)
        if route is not None:
            for table in self.tables:
                table.remove(route)

    def recount(self) -> None:
        """After a policy change: each route counts under the cluster that now admits its peer."""
        for key, route in list(self.routes.items()):
            counts = self.counts_of(route.peer)
            if counts is not route.counts:
                self.routes[key] = route = replace(route, counts=counts)
                for table in self.tables:
                    table.install(route)

    def clear(self) -> None:
        self.routes.clear()
        for table in self.tables:
            table.clear()
