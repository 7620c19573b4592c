"""The C relay's copy of a TURN-UDP listener's channel routes (a `RouteTable`).

Each route is two entries of `stunnerd._fastpath`: (listener socket, client, channel) → relay
socket and peer, and (relay socket, peer) → listener socket, client and channel, with the C
counter slot of the peer's cluster. Only relay sockets the C relay reads get routes there: a
datagram on any other socket never reaches its tables.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from stunnerd.route_table.table import NOT_ROUTED, ChannelRoute, RouteView

if TYPE_CHECKING:
    from stunnerd.fastpath import FastPath


class FastPathRoutes:
    """`RouteTable` over one listener socket's routes in the C relay."""

    offload_only = False

    __slots__ = ("fastpath", "listener")

    def __init__(self, fastpath: FastPath, listener: socket.socket) -> None:
        self.fastpath = fastpath
        self.listener = listener

    def install(self, route: ChannelRoute) -> None:
        fp, lfd, rfd = self.fastpath, self.listener.fileno(), route.relay.sock.fileno()
        if lfd < 0 or rfd not in fp.handlers:
            return
        slot = fp.slot(route.counts)
        (client_ip, client_port), (peer_ip, peer_port) = route.client, route.peer
        fp.relay.add_client_route(
            lfd, client_ip, client_port, route.channel, rfd, peer_ip, peer_port, slot
        )
        fp.relay.add_peer_route(
            rfd, peer_ip, peer_port, route.channel, lfd, client_ip, client_port, slot
        )

    def remove(self, route: ChannelRoute) -> None:
        relay, lfd, rfd = self.fastpath.relay, self.listener.fileno(), route.relay.sock.fileno()
        if self.fastpath.closed:
            return
        if lfd >= 0:
            relay.remove_client_route(lfd, route.client[0], route.client[1], route.channel)
        if rfd >= 0:
            relay.remove_peer_route(rfd, route.peer[0], route.peer[1], 0)

    def clear(self) -> None:
        lfd = self.listener.fileno()
        if lfd >= 0 and not self.fastpath.closed:
            self.fastpath.relay.forget(lfd)

    def lookup(self, route: ChannelRoute) -> RouteView:
        relay, lfd, rfd = self.fastpath.relay, self.listener.fileno(), route.relay.sock.fileno()
        out = relay.lookup_client_route(lfd, route.client[0], route.client[1], route.channel)
        back = relay.lookup_peer_route(rfd, route.peer[0], route.peer[1], 0)
        if out is None and back is None:
            return NOT_ROUTED
        return RouteView(
            (out[1][0], out[1][1]) if out is not None and out[0] == rfd else None,
            back[2] if back is not None and back[0] == lfd else None,
        )
