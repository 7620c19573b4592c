"""The kernel's copy of a TURN-UDP listener's channel routes (a `RouteTable`).

A listener's routes go through the process-wide `OffloadManager`, which keeps them while no
engine is attached and writes them into the BPF maps when one is. The kernel program is
IPv4-only and must not relay the channels of an allocation whose credentials were withdrawn, so
this table holds fewer routes than the user-space ones: `offload_only`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from stunnerd.route_table.table import NOT_ROUTED, Address, ChannelRoute, RouteView, Traffic

if TYPE_CHECKING:
    from stunnerd.offload.datapath import Datapath


class Channels(Protocol):
    """What the table needs of the process-wide `stunnerd.offload.manager.OffloadManager`."""

    @property
    def datapath(self) -> Datapath | None:
        """The maps, while an engine is attached."""

    def channel_added(
        self,
        listener: str,
        client: Address,
        channel: int,
        peer: Address,
        *,
        listener_addr: Address,
        relay_addr: Address,
        listener_traffic: Traffic,
        cluster_traffic: Traffic,
    ) -> None:
        """Relay the channel in the kernel (now, or once an engine attaches)."""

    def channel_removed(self, listener: str, client: Address, channel: int) -> None:
        """Stop relaying the channel in the kernel."""

    def listener_closed(self, listener: str) -> None:
        """Stop relaying every channel of `listener` in the kernel."""


class OffloadRoutes:
    """`RouteTable` over one listener's channels in the kernel offload."""

    offload_only = True

    __slots__ = ("listener", "listener_addr", "listener_traffic", "manager")

    def __init__(
        self,
        manager: Channels,
        listener: str,
        listener_addr: Address,
        listener_traffic: Traffic,
    ) -> None:
        self.manager = manager
        self.listener = listener
        self.listener_addr = listener_addr  # the bound address (a wildcard host is fine)
        self.listener_traffic = listener_traffic

    def install(self, route: ChannelRoute) -> None:
        if not route.offload:
            self.remove(route)
            return
        relay_addr = route.relay.sock.getsockname()
        self.manager.channel_added(
            self.listener,
            route.client,
            route.channel,
            route.peer,
            listener_addr=self.listener_addr,
            relay_addr=(relay_addr[0], relay_addr[1]),
            listener_traffic=self.listener_traffic,
            cluster_traffic=route.counts,
        )

    def remove(self, route: ChannelRoute) -> None:
        self.manager.channel_removed(self.listener, route.client, route.channel)

    def clear(self) -> None:
        self.manager.listener_closed(self.listener)

    def lookup(self, route: ChannelRoute) -> RouteView:
        """What the maps hold for the route (the kernel relays it where it is attached)."""
        dp = self.manager.datapath
        if dp is None:
            return NOT_ROUTED
        from stunnerd.offload.maps import Fwd, client_key, destination, peer_key

        try:
            out_key = client_key(route.client, self.listener_addr[1], route.channel)
            back_key = peer_key(route.peer, route.relay.sock.getsockname()[1])
        except OSError:  # not IPv4: never in the maps
            return NOT_ROUTED
        out, back = Fwd(), Fwd()
        to_peer = dp.chan.lookup(out_key, out)
        to_client = dp.peer.lookup(back_key, back)
        if not (to_peer or to_client):
            return NOT_ROUTED
        return RouteView(
            destination(out) if to_peer else None,
            int(back.channel) if to_client else None,
        )
