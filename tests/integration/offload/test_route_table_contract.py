"""One contract for the three copies of a listener's channel routes.

The same engine effects go through `ChannelRoutes` to one table at a time: the asyncio edge's
dicts, the C relay's hash tables and the kernel offload's BPF maps. After every step each table
must route exactly the channels the effects left routed, both ways (client → peer, and the
channel a peer's datagrams come back on), read from the table itself: the dicts, the C tables
through `lookup_*_route`, the maps through the kernel. The kernel's copy leaves out a revoked
route (`offload=False`: user space relays it, the kernel must not).

The BPF table loads the offload object and writes its maps without attaching the program
anywhere (the worker processes' `SharedMaps` view), so no traffic is touched; loading needs
root (CAP_BPF) and the built object, and the test says so where either is missing.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

import pytest

from stunnerd import fastpath
from stunnerd.offload.datapath import Datapath, SharedMaps
from stunnerd.offload.libbpf import OffloadError
from stunnerd.offload.manager import OffloadManager
from stunnerd.offload.table import OffloadRoutes
from stunnerd.route_table.channels import ChannelRoutes
from stunnerd.route_table.python import ClientRoutes, PythonRoutes
from stunnerd.route_table.table import (
    NOT_ROUTED,
    Address,
    ChannelRoute,
    PeerChannels,
    RouteTable,
    RouteView,
    Traffic,
)
from stunnerd.turn.effects import ChannelRouteAdded, ChannelRouteRemoved

pytestmark = pytest.mark.integration

C1, C2, C3 = ("127.0.0.1", 40001), ("127.0.0.1", 40002), ("127.0.0.1", 40003)
P1, P2, P3 = ("127.0.0.2", 50001), ("127.0.0.2", 50002), ("127.0.0.3", 50003)


def udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


@dataclass
class Relay:
    """An allocation's relay socket as the tables see it (`RelayEnd`), open."""

    sock: socket.socket
    peer_channels: PeerChannels = field(default_factory=dict)
    transport: object = True


@dataclass
class Rig:
    """A listener socket, one relay per client, cluster counters per peer, and one table."""

    listener: socket.socket
    relays: dict[Address, Relay]
    counts: dict[Address, Traffic]
    table: RouteTable
    routes: ChannelRoutes = field(init=False)

    def __post_init__(self) -> None:
        self.routes = ChannelRoutes(
            lambda client, _ip: self.relays.get(client), self.counts.__getitem__, self.table
        )

    def route(self, client: Address, channel: int, peer: Address) -> ChannelRoute:
        return ChannelRoute(client, channel, peer, self.relays[client], self.counts[peer])


TableFactory = Callable[[ExitStack, socket.socket, dict[Address, Relay]], RouteTable]


def python_table(_stack: ExitStack, _listener: socket.socket, _relays: object) -> RouteTable:
    client_routes: ClientRoutes = {}
    return PythonRoutes(client_routes)


def fastpath_table(
    stack: ExitStack, listener: socket.socket, relays: dict[Address, Relay]
) -> RouteTable:
    if not fastpath.available():
        if os.environ.get("CI"):
            pytest.fail("stunnerd._fastpath was not built (gcc and Python headers needed)")
        pytest.skip("stunnerd._fastpath is not built")
    from stunnerd.fastpath.table import FastPathRoutes

    loop = asyncio.new_event_loop()
    stack.callback(loop.close)
    fp = fastpath.FastPath(loop)
    stack.callback(fp.close)
    counts: Traffic = [0, 0, 0, 0]
    fp.watch_listener(listener, counts, lambda data, addr: None)
    for relay in relays.values():
        fp.watch_relay(relay.sock, counts, lambda data, addr: None)
    return FastPathRoutes(fp, listener)


def offload_table(
    stack: ExitStack, listener: socket.socket, _relays: dict[Address, Relay]
) -> RouteTable:
    try:
        loaded = Datapath()
    except OffloadError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the offload tests: {exc}")
        pytest.skip(f"the offload program cannot be loaded here: {exc}")
    stack.callback(loaded.close)
    chan_fd, peer_fd = loaded.map_fds()
    manager = OffloadManager(lambda: SharedMaps(os.dup(chan_fd), os.dup(peer_fd), {}, 1))
    manager.configure("TC")  # the shared maps' "attach" attaches nothing
    stack.callback(manager.close)
    assert manager.active, manager.status()
    traffic: Traffic = [0, 0, 0, 0]
    return OffloadRoutes(manager, "udp", listener.getsockname(), traffic)


TABLES: dict[str, TableFactory] = {
    "python": python_table,
    "fastpath": fastpath_table,
    "offload": offload_table,
}


@pytest.fixture(params=sorted(TABLES))
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with ExitStack() as stack:
        listener = udp()
        stack.callback(listener.close)
        relays = {}
        for client in (C1, C2, C3):
            relays[client] = Relay(udp())
            stack.callback(relays[client].sock.close)
        table = TABLES[request.param](stack, listener, relays)
        counts = {peer: [0, 0, 0, 0] for peer in (P1, P2, P3)}
        try:
            yield Rig(listener, relays, counts, table)
        finally:
            table.clear()  # before the loop, the maps and the sockets go


Routed = dict[tuple[Address, int], tuple[Address, bool]]
"""What the effects left routed: (client, channel) → (peer, offload)."""

ADD_1 = ChannelRouteAdded(C1, 0x4000, P1)
ADD_2 = ChannelRouteAdded(C1, 0x4001, P2)
ADD_3 = ChannelRouteAdded(C2, 0x4000, P1)  # another allocation: the same channel and peer
REVOKE_1 = ChannelRouteAdded(C1, 0x4000, P1, offload=False)
SCRIPT: list[tuple[str, ChannelRouteAdded | ChannelRouteRemoved | None, Routed]] = [
    ("bind", ADD_1, {(C1, 0x4000): (P1, True)}),
    ("second channel", ADD_2, {(C1, 0x4000): (P1, True), (C1, 0x4001): (P2, True)}),
    (
        "other allocation",
        ADD_3,
        {(C1, 0x4000): (P1, True), (C1, 0x4001): (P2, True), (C2, 0x4000): (P1, True)},
    ),
    (
        "revoke",
        REVOKE_1,
        {(C1, 0x4000): (P1, False), (C1, 0x4001): (P2, True), (C2, 0x4000): (P1, True)},
    ),
    (
        "grant again",
        ADD_1,
        {(C1, 0x4000): (P1, True), (C1, 0x4001): (P2, True), (C2, 0x4000): (P1, True)},
    ),
    (
        "remove",
        ChannelRouteRemoved(C1, 0x4001, P2),
        {(C1, 0x4000): (P1, True), (C2, 0x4000): (P1, True)},
    ),
    (
        "remove what was never routed",
        ChannelRouteRemoved(C3, 0x4005, P3),
        {(C1, 0x4000): (P1, True), (C2, 0x4000): (P1, True)},
    ),
    ("policy change", None, {(C1, 0x4000): (P1, True), (C2, 0x4000): (P1, True)}),
]
EVERY_ROUTE = [(C1, 0x4000, P1), (C1, 0x4001, P2), (C2, 0x4000, P1), (C3, 0x4005, P3)]


def observed(rig: Rig) -> dict[tuple[Address, int], RouteView]:
    views = {}
    for client, channel, peer in EVERY_ROUTE:
        view = rig.table.lookup(rig.route(client, channel, peer))
        if view != NOT_ROUTED:
            views[(client, channel)] = view
    return views


def expected(rig: Rig, routed: Routed) -> dict[tuple[Address, int], RouteView]:
    return {
        (client, channel): RouteView(peer, channel)
        for (client, channel), (peer, offload) in routed.items()
        if offload or not rig.table.offload_only
    }


def test_every_table_routes_what_the_effects_left_routed(rig: Rig) -> None:
    for step, effect, routed in SCRIPT:
        if isinstance(effect, ChannelRouteAdded):
            rig.routes.added(effect)
        elif isinstance(effect, ChannelRouteRemoved):
            rig.routes.removed(effect)
        else:  # the peers now count under other clusters
            rig.counts.update({peer: [0, 0, 0, 0] for peer in rig.counts})
            rig.routes.recount()
        assert observed(rig) == expected(rig, routed), step


def test_clearing_forgets_every_route(rig: Rig) -> None:
    for effect in (ADD_1, ADD_2, ADD_3):
        rig.routes.added(effect)
    rig.routes.clear()
    assert observed(rig) == {}
    assert rig.routes.routes == {}


def test_a_route_whose_relay_is_not_open_is_in_no_table(rig: Rig) -> None:
    rig.relays[C1].transport = None
    rig.routes.added(ADD_1)
    assert observed(rig) == {}
