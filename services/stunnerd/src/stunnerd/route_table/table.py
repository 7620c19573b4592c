"""The interface of a channel-route table: what every copy of a listener's routes offers.

A bound channel (RFC 8656 §12) lets ChannelData flow between a client and a peer without the
engine: ChannelData from the client on the channel goes to the peer through the allocation's
relay socket, and the peer's datagrams to the relay come back to the client framed on the
channel. Up to three tables relay such traffic, each on its own: the asyncio listener and relay
protocols (`route_table.python`), the C relay (`fastpath.table`) and the kernel program
(`offload.table`). They all get the same calls, from the same effects (`route_table.channels`),
and a contract test checks that they then route alike. None of them judges a peer: a route
exists only after the engine admitted its peer (routes, protected ranges, the IPv4 address an
IPv6 peer carries: `stunnerd.routing`) and leaves when a new policy no longer admits it, so the
C relay and the kernel relay nothing the engine would refuse
(`tests/unit/stunnerd/test_embedded_peers.py`).

An `offload=False` route is one whose allocation's credentials the config withdrew: user space
keeps relaying it, the kernel must not (`offload_only` tables leave it out).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Protocol

Address = tuple[str, int]
Traffic = list[int]  # [rx packets, rx bytes, tx packets, tx bytes]
PeerChannels = dict[Any, tuple[int, Traffic]]
"""A relay's peer → client half: peer address (as the socket reports it) → channel, counters."""


class RelayEnd(Protocol):
    """An allocation's relay socket, as the tables see it."""

    @property
    def sock(self) -> socket.socket: ...

    @property
    def peer_channels(self) -> PeerChannels: ...

    @property
    def transport(self) -> object:
        """None until the relay reads its socket (and a route through it can relay)."""


@dataclass(frozen=True, slots=True)
class ChannelRoute:
    """One routed channel of one allocation, resolved by the listener."""

    client: Address
    channel: int
    peer: Address
    relay: RelayEnd  # the allocation's relay for the peer's address family
    counts: Traffic  # the counters of the cluster that admitted the peer
    offload: bool = True  # False: relayed in user space only (credentials withdrawn)


@dataclass(frozen=True, slots=True)
class RouteView:
    """What one table does with a route's traffic, each way (None: that half is not routed)."""

    to_peer: Address | None  # where the client's ChannelData on the channel goes
    to_client: int | None  # the channel the peer's datagrams to the relay come back on


NOT_ROUTED = RouteView(None, None)


class RouteTable(Protocol):
    """One copy of a listener's channel routes."""

    offload_only: bool
    """True for the kernel's copy: it leaves out routes whose `offload` is False."""

    def install(self, route: ChannelRoute) -> None:
        """Route the channel both ways, or update a routed one (its counters, its `offload`)."""

    def remove(self, route: ChannelRoute) -> None:
        """Stop routing the channel (given as it was installed)."""

    def clear(self) -> None:
        """Forget every route (the listener closes)."""

    def lookup(self, route: ChannelRoute) -> RouteView:
        """What this copy does now with the route's traffic (tests and diagnostics)."""


def wire_forms(addr: Address) -> tuple[Any, ...]:
    """The address tuples asyncio hands us for `addr`: IPv6 sockets add flowinfo and scope id."""
    if ":" in addr[0]:
        return (addr, (addr[0], addr[1], 0, 0))
    return (addr,)
