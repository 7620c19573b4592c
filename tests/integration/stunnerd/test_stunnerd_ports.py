"""The interfaces the edge is handed (`stunnerd.net.ports`), each met by a stand-in on real
loopback sockets: the server uses what it was given, and nothing else, for the quota, the kernel
offload, the C relay, the journal of allocations and allocations handed over."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioice import stun
from fixtures.stunnerd.client import UdpTurnClient
from fixtures.stunnerd.inproc import make_config

from stunnerd.net.ports import (
    AllocationJournal,
    Datagram,
    FastPathPort,
    HandedState,
    OffloadPort,
    QuotaPort,
)
from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.net.tuning import ServerTuning
from stunnerd.route_table.table import NOT_ROUTED, Address, ChannelRoute, RouteView, Traffic
from stunnerd.turn.allocation import Allocation
from stunnerd.turn.guard import ChallengeBudget
from stunnerd.workers.local import LocalDataplane
from support.stunnerd_process import USER

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def server_addr(config: Any) -> tuple[str, int]:
    return ("127.0.0.1", config.listeners[0].port)


class RecordingRoutes:
    """A `RouteTable` that keeps what it was told."""

    offload_only = False

    def __init__(self) -> None:
        self.installed: list[ChannelRoute] = []
        self.cleared = 0

    def install(self, route: ChannelRoute) -> None:
        self.installed.append(route)

    def remove(self, route: ChannelRoute) -> None:
        self.installed.remove(route)

    def clear(self) -> None:
        self.cleared += 1

    def lookup(self, route: ChannelRoute) -> RouteView:
        return NOT_ROUTED


class RecordingQuota:
    """A `QuotaPort` that admits the users in `admitted` and records every call."""

    def __init__(self, admitted: set[str]) -> None:
        self.admitted = admitted
        self.limit = 0
        self.terms: list[tuple[str, str, int]] = []
        self.acquired: list[str] = []
        self.closed = False

    @property
    def enforcing(self) -> bool:
        return self.limit > 0

    def lease_id(self, listener: str, client: Address) -> str:
        return f"{listener}|{client[0]}:{client[1]}"

    async def acquire(self, user_id: str, lease: str, lifetime_s: float) -> bool:
        self.acquired.append(user_id)
        return user_id in self.admitted

    def renew(self, lease: str, lifetime_s: float) -> None:
        return None

    def release(self, lease: str) -> None:
        return None

    def configure(self, scope: str, realm: str, limit: int) -> None:
        self.terms.append((scope, realm, limit))
        self.limit = limit

    def status(self) -> dict[str, Any]:
        return {"mode": "recording"}

    async def close(self) -> None:
        self.closed = True


async def test_the_server_asks_the_quota_it_was_given_and_refuses_over_it_with_486(
    no_leaked_tasks: None,
) -> None:
    quota = RecordingQuota(admitted=set())
    port: QuotaPort = quota
    config = make_config(user_quota=1)
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="127.0.0.1"), quota=port))
    try:
        await dataplane.apply(config)
        assert quota.terms[-1] == (config.admin.name, config.auth.realm, 1)
        async with UdpTurnClient(server_addr(config)) as client:
            assert (await client.allocate()).error_code == 486
        assert quota.acquired == [USER]
        assert dataplane.server.allocation_count == 0
        assert dataplane.quota_status() == {"mode": "recording"}
    finally:
        await dataplane.close()
    assert quota.closed


class RecordingOffload:
    """An `OffloadPort` that hands out recording route tables."""

    def __init__(self) -> None:
        self.tables: dict[str, tuple[Address, RecordingRoutes]] = {}
        self.engines: list[str] = []
        self.closed = False

    def routes(self, listener: str, address: Address, traffic: Traffic) -> RecordingRoutes:
        table = RecordingRoutes()
        self.tables[listener] = (address, table)
        return table

    def configure(self, engine: str, interfaces: tuple[str, ...] | list[str] = ()) -> None:
        self.engines.append(engine)

    def poll(self) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"engine": self.engines[-1] if self.engines else "None"}

    def let_go(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


async def test_a_turn_udp_listener_mirrors_its_channel_routes_into_the_offload_it_was_given(
    no_leaked_tasks: None,
) -> None:
    offload = RecordingOffload()
    port: OffloadPort = offload
    config = make_config()
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="127.0.0.1"), offload=port))
    try:
        await dataplane.apply(config)
        address, table = offload.tables["turn-udp"]
        assert address == server_addr(config)
        assert offload.engines == [config.admin.offload_engine]
        async with UdpTurnClient(server_addr(config)) as client:
            assert (await client.allocate()).message_class == stun.Class.RESPONSE
            peer = {"XOR-PEER-ADDRESS": ("127.0.0.1", 9)}
            bound = await client.request(
                stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4001, **peer}
            )
            assert bound.message_class == stun.Class.RESPONSE
            assert [(r.channel, r.peer) for r in table.installed] == [(0x4001, ("127.0.0.1", 9))]
    finally:
        await dataplane.close()
    assert offload.closed


class PythonFastPath:
    """A `FastPathPort` in Python: it reads the sockets it watches with the loop and routes
    nothing, so every datagram reaches the handler the listener gave it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.watched: dict[int, str] = {}
        self.tables: list[RecordingRoutes] = []
        self.folds = 0
        self.closed = False

    def _read(self, sock: socket.socket, handler: Datagram) -> None:
        try:
            data, addr = sock.recvfrom(65535)
        except BlockingIOError:
            return
        handler(data, addr)

    def watch_listener(
        self,
        sock: socket.socket,
        counts: list[int],
        handler: Datagram,
        max_stun_bytes: int = 0,
        max_datagram_bytes: int = 0,
    ) -> None:
        self.watched[sock.fileno()] = "listener"
        self.loop.add_reader(sock.fileno(), self._read, sock, handler)

    def answer_binding(self, sock: socket.socket, software: str | None) -> None:
        return None

    def answer_challenges(
        self, listener: socket.socket, template: bytes | None, valid_s: float
    ) -> None:
        return None

    def challenge_budget(
        self, listener: socket.socket, rate_per_s: float, burst: int, sources: int
    ) -> ChallengeBudget:
        return ChallengeBudget(rate_per_s, burst, sources)

    def watch_relay(self, sock: socket.socket, counts: list[int], handler: Datagram) -> None:
        self.watched[sock.fileno()] = "relay"
        self.loop.add_reader(sock.fileno(), self._read, sock, handler)

    def unwatch(self, sock: socket.socket) -> None:
        if sock.fileno() >= 0 and self.watched.pop(sock.fileno(), None) is not None:
            self.loop.remove_reader(sock.fileno())

    def routes(self, listener: socket.socket) -> RecordingRoutes:
        table = RecordingRoutes()
        self.tables.append(table)
        return table

    def fold(self) -> None:
        self.folds += 1

    def take_drops(self, listener: socket.socket) -> tuple[int, int, int]:
        return 0, 0, 0

    def stats(self) -> dict[str, int]:
        return {"watched": len(self.watched)}

    def close(self) -> None:
        self.closed = True


async def test_turn_udp_sockets_are_read_by_the_relay_the_factory_built(
    no_leaked_tasks: None,
) -> None:
    built: list[PythonFastPath] = []

    def factory(loop: asyncio.AbstractEventLoop) -> FastPathPort:
        built.append(PythonFastPath(loop))
        return built[-1]

    config = make_config()
    server = TurnServer(
        ServerOptions(bind_host="127.0.0.1", tuning=ServerTuning(fastpath=True)), fastpath=factory
    )
    dataplane = LocalDataplane(server)
    try:
        await dataplane.apply(config)
        [relay] = built
        assert list(relay.watched.values()) == ["listener"]
        assert len(relay.tables) == 1
        async with UdpTurnClient(server_addr(config)) as client:
            assert (await client.allocate()).message_class == stun.Class.RESPONSE
            assert sorted(relay.watched.values()) == ["listener", "relay"]
        dataplane.stats()
        assert relay.folds >= 1
        assert server.fastpath_stats == {"watched": 2}
    finally:
        await dataplane.close()
    assert built[0].closed


@dataclass
class RecordingJournal:
    """An `AllocationJournal` that keeps each change as (listener, client, expires, fds)."""

    changes: list[tuple[str, Address, float, int]] = field(default_factory=list)
    deletions: list[tuple[str, Address]] = field(default_factory=list)

    def changed(
        self, listener: str, allocation: Allocation, now: float, fds: Sequence[int]
    ) -> None:
        self.changes.append((listener, allocation.client, allocation.expires - now, len(fds)))

    def deleted(self, listener: str, client: Address) -> None:
        self.deletions.append((listener, client))


async def test_turn_udp_allocations_are_journaled_where_the_server_was_told(
    no_leaked_tasks: None,
) -> None:
    journal = RecordingJournal()
    port: AllocationJournal = journal
    config = make_config()
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="127.0.0.1"), journal=port))
    try:
        await dataplane.apply(config)
        async with UdpTurnClient(server_addr(config)) as client:
            assert (await client.allocate()).message_class == stun.Class.RESPONSE
            assert client.transport is not None
            me = client.transport.get_extra_info("sockname")
            [(listener, who, left, fds)] = journal.changes
            assert (listener, who, fds) == ("turn-udp", me, 1)
            assert 0 < left <= 600
            await client.request(stun.Method.REFRESH, {"LIFETIME": 0})
            assert journal.deletions == [("turn-udp", me)]
    finally:
        await dataplane.close()


@dataclass(frozen=True)
class Handed:
    """A `HandedAllocation` without channels or permissions."""

    client: Address
    relay: Address
    user_id: str = USER
    key: bytes = b"k" * 16
    username: str = USER
    family: int = 4
    expires_in_s: float = 600.0
    additional: Address | None = None
    tcp: bool = False
    permissions: Mapping[str, float] = field(default_factory=dict)
    channels: tuple[Any, ...] = ()


@dataclass(frozen=True)
class HandedListenerRecord:
    name: str
    allocations: tuple[Handed, ...]


@dataclass(frozen=True)
class HandedDocument:
    listeners: tuple[HandedListenerRecord, ...]

    def relay_addresses(self) -> list[Address]:
        return [a.relay for lst in self.listeners for a in lst.allocations]


async def test_a_handed_over_allocation_is_carried_on_when_its_listener_starts(
    no_leaked_tasks: None,
) -> None:
    relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    relay.bind(("127.0.0.1", 0))
    client = ("127.0.0.1", 40_000)
    state: HandedState = HandedDocument(
        (HandedListenerRecord("turn-udp", (Handed(client, relay.getsockname()),)),)
    )
    server = TurnServer(ServerOptions(bind_host="127.0.0.1"))
    with pytest.raises(ValueError, match="0 relay sockets for 1"):
        server.adopt(state, [])
    server.adopt(state, [relay])
    dataplane = LocalDataplane(server)
    try:
        await dataplane.apply(make_config())
        listener = server.listeners["turn-udp"]
        assert list(listener.engine.allocations) == [client]
        assert server.allocation_count == 1
    finally:
        await dataplane.close()
