"""TURN-TCP relays (RFC 6062) through real TCP and TLS listeners to a TCP echo peer on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.stunnerd.inproc import DEFAULT_TUNING, make_config, running_dataplane
from fixtures.stunnerd.tcp_client import (
    Credentials,
    TurnTcpConnection,
    bind_data_connection,
    tcp_echo,
)

from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.workers.local import LocalDataplane
from support.stun import aioice_knows_turn_attributes
from support.stunnerd_process import ManagedStunnerd, base_config, health_port, listener_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STEP_S = 5.0


@pytest.fixture(autouse=True)
def _aioice_connection_id() -> Iterator[None]:
    with aioice_knows_turn_attributes():
        yield


def listener_addr(config: object) -> tuple[str, int]:
    return ("127.0.0.1", config.listeners[0].port)  # type: ignore[attr-defined]


async def echoed(data: TurnTcpConnection, payload: bytes) -> bytes:
    data.writer.write(payload)
    got = b""
    async with asyncio.timeout(STEP_S):
        while len(got) < len(payload):
            chunk = await data.reader.read(65536)
            assert chunk, "the data connection closed"
            got += chunk
    return got


async def relayed_to(
    server: tuple[str, int], peer: tuple[str, int]
) -> tuple[TurnTcpConnection, TurnTcpConnection]:
    """A TCP allocation, a Connect to `peer` and a bound data connection that echoes."""
    creds = Credentials()
    control = await TurnTcpConnection.open(server, creds)
    assert (await control.allocate_tcp()).error_code is None
    connected = await control.connect(peer)
    data, bound = await bind_data_connection(server, creds, connected.attributes["CONNECTION-ID"])
    assert bound.error_code is None
    assert await echoed(data, b"ping") == b"ping"
    return control, data


@pytest.mark.parametrize("protocol", ["TURN-TCP", "TURN-TLS"])
async def test_connect_and_connection_bind_relay_bytes_both_ways(
    no_leaked_tasks: None, protocol: str
) -> None:
    config = make_config((protocol,))
    tls = protocol == "TURN-TLS"
    async with running_dataplane(config) as dataplane, tcp_echo() as echo:
        creds = Credentials()
        control = await TurnTcpConnection.open(listener_addr(config), creds, tls)
        allocated = await control.allocate_tcp()
        assert allocated.error_code is None
        relay = allocated.attributes["XOR-RELAYED-ADDRESS"]
        assert relay[0] == "127.0.0.1"
        connected = await control.connect(echo.addr)
        assert connected.error_code is None
        connection_id = connected.attributes["CONNECTION-ID"]
        data, bound = await bind_data_connection(listener_addr(config), creds, connection_id, tls)
        assert bound.error_code is None
        payload = bytes(range(256)) * 64  # 16 KiB, several reads
        assert await echoed(data, payload) == payload
        assert echo.sources == [tuple(relay)]  # the peer saw the relayed transport address
        server = dataplane.server
        cluster = server.cluster_traffic["loopback"]
        assert cluster[1] == len(payload)  # rx bytes
        assert cluster[3] == len(payload)  # tx bytes
        listener = server.listener_traffic[protocol.lower()]
        assert listener[1] > len(payload)  # rx: the requests and the payload from the client
        assert listener[3] > len(payload)  # tx: the answers and the payload to the client
        assert server.allocation_counts() == {protocol.lower(): 1}
        await data.close()
        async with asyncio.timeout(STEP_S):
            await echo.closed.wait()  # the client closed its data connection: the peer's goes
        assert (await control.request(0x0004, {})).error_code is None  # the allocation stays
        await control.close()


async def test_incoming_peer_gets_a_connection_attempt_and_is_relayed_after_bind(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TCP",))
    async with running_dataplane(config):
        creds = Credentials()
        control = await TurnTcpConnection.open(listener_addr(config), creds)
        relay = (await control.allocate_tcp()).attributes["XOR-RELAYED-ADDRESS"]
        # no permission yet: the peer is refused
        async with asyncio.timeout(STEP_S):
            reader, writer = await asyncio.open_connection(relay[0], relay[1])
            assert await reader.read(10) == b""
        writer.close()
        allowed = await control.request(0x0008, {"XOR-PEER-ADDRESS": ("127.0.0.1", 0)})
        assert allowed.error_code is None
        async with asyncio.timeout(STEP_S):
            reader, writer = await asyncio.open_connection(relay[0], relay[1])
        writer.write(b"early bytes wait for the bind")
        attempt = await control.connection_attempt()
        assert attempt.attributes["XOR-PEER-ADDRESS"] == writer.get_extra_info("sockname")[:2]
        data, bound = await bind_data_connection(
            listener_addr(config), creds, attempt.attributes["CONNECTION-ID"]
        )
        assert bound.error_code is None
        async with asyncio.timeout(STEP_S):
            assert await data.reader.readexactly(29) == b"early bytes wait for the bind"
        data.writer.write(b"to the peer")
        async with asyncio.timeout(STEP_S):
            assert await reader.readexactly(11) == b"to the peer"
        writer.close()  # the peer leaves: the data connection goes too
        assert await data.closed_by_server()
        await data.close()
        await control.close()


async def test_peer_outside_the_routes_gets_403_and_no_connection() -> None:
    config = make_config(("TURN-TCP",), endpoints=("10.0.0.0/8",))
    async with running_dataplane(config), tcp_echo() as echo:
        control = await TurnTcpConnection.open(listener_addr(config), Credentials())
        assert (await control.allocate_tcp()).error_code is None
        assert (await control.connect(echo.addr)).error_code == 403
        assert echo.sources == []
        await control.close()


async def test_a_second_connect_to_the_same_peer_gets_446_and_an_unbound_id_400() -> None:
    config = make_config(("TURN-TCP",))
    async with running_dataplane(config), tcp_echo() as echo:
        creds = Credentials()
        control = await TurnTcpConnection.open(listener_addr(config), creds)
        await control.allocate_tcp()
        first = await control.connect(echo.addr)
        assert (await control.connect(echo.addr)).error_code == 446
        data, bound = await bind_data_connection(
            listener_addr(config), creds, first.attributes["CONNECTION-ID"] + 1
        )
        assert bound.error_code == 400
        await data.close()
        await control.close()


async def test_connect_to_a_closed_port_gets_447() -> None:
    config = make_config(("TURN-TCP",))
    async with running_dataplane(config), tcp_echo() as echo:
        closed_port = echo.addr[1]
    async with running_dataplane(config):
        control = await TurnTcpConnection.open(listener_addr(config), Credentials())
        await control.allocate_tcp()
        assert (await control.connect(("127.0.0.1", closed_port))).error_code == 447
        await control.close()


async def test_refresh_with_zero_lifetime_closes_the_data_and_peer_connections(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TCP",))
    async with running_dataplane(config), tcp_echo() as echo:
        control, data = await relayed_to(listener_addr(config), echo.addr)
        refreshed = await control.request(0x0004, {"LIFETIME": 0})
        assert refreshed.error_code is None
        assert await data.closed_by_server()
        async with asyncio.timeout(STEP_S):
            await echo.closed.wait()
        await data.close()
        await control.close()


async def test_a_reconcile_that_drops_the_route_closes_the_data_connection(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TCP",))
    async with running_dataplane(config) as dataplane, tcp_echo() as echo:
        control, data = await relayed_to(listener_addr(config), echo.addr)
        narrowed = config.model_copy(
            update={
                "clusters": [config.clusters[0].model_copy(update={"endpoints": ["10.0.0.0/8"]})]
            }
        )
        outcome = await dataplane.apply(narrowed)
        assert outcome.applied
        assert await data.closed_by_server()
        async with asyncio.timeout(STEP_S):
            await echo.closed.wait()
        assert (await control.request(0x0004, {})).error_code is None  # the allocation lives on
        await data.close()
        await control.close()


async def test_tcp_allocations_are_refused_with_442_on_udp_listeners_and_in_workers() -> None:
    config = make_config(("TURN-TCP",))
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="127.0.0.1", tcp_relays=False)))
    try:
        await dataplane.reconciler.apply(config)
        control = await TurnTcpConnection.open(listener_addr(config), Credentials())
        refused = await control.allocate_tcp()
        assert refused.error_code == 442
        assert "single worker" in refused.attributes["ERROR-CODE"][1]
        await control.close()
    finally:
        await dataplane.close()


async def test_worker_processes_refuse_tcp_allocations_with_442_and_keep_udp_ones(
    tmp_path: Path,
) -> None:
    """With --udp-thread-num 2 a data connection may reach another worker than its allocation:
    TCP relays are refused clearly there (see the stunnerd README), UDP relays still work."""
    ports = listener_ports("tcp")
    config = base_config(health_port(), ports)
    config["listeners"][0]["protocol"] = "TURN-TCP"
    server = ManagedStunnerd(tmp_path, config, "--udp-thread-num", "2")
    try:
        await server.ready()
        for _ in range(4):  # new connections, so that both workers are likely asked
            control = await TurnTcpConnection.open(("127.0.0.1", ports["tcp"]), Credentials())
            refused = await control.allocate_tcp()
            assert refused.error_code == 442
            assert "single worker" in refused.attributes["ERROR-CODE"][1]
            udp = await control.request(0x0003, {"REQUESTED-TRANSPORT": 17 << 24})
            assert udp.error_code is None
            await control.close()
    finally:
        await server.close()


async def test_connects_at_ten_times_the_per_allocation_limit_get_508_and_others_relay() -> None:
    # RFC 6062 peer connections per allocation (docs/limits.md), the attacker at 10x a lowered
    # limit beside 20 honest allocations: only `limit` peer connections are opened for it, each
    # one more Connect is answered 508 (RFC 8656 §11.2's Insufficient Capacity), and every honest
    # allocation still connects and relays.
    limit = 4
    tuning = dataclasses.replace(DEFAULT_TUNING, max_tcp_connections_per_allocation=limit)
    config = make_config(("TURN-TCP",))
    server = listener_addr(config)
    async with running_dataplane(config, tuning=tuning), contextlib.AsyncExitStack() as stack:
        peers = [await stack.enter_async_context(tcp_echo()) for _ in range(10 * limit)]
        attacker = await TurnTcpConnection.open(server, Credentials())
        assert (await attacker.allocate_tcp()).error_code is None
        codes = [(await attacker.connect(peer.addr)).error_code for peer in peers]
        assert codes.count(None) == limit, codes
        assert codes.count(508) == 9 * limit, codes
        honest = [await relayed_to(server, peers[i].addr) for i in range(20)]
        # Each peer saw the connections made to it: the attacker's `limit`, one per honest one.
        assert sum(len(peer.writers) for peer in peers) == limit + len(honest)
        for control, data in honest:
            assert await echoed(data, b"still here") == b"still here"
            await data.close()
            await control.close()
        await attacker.close()
