"""IPv6 peers that carry IPv4 addresses, over real sockets, under upstream's wildcard routes.

`64:ff9b::7f00:1` (NAT64), `2002:7f00:1::` (6to4), `::127.0.0.1` (IPv4-compatible) and Teredo
forms reach loopback or the metadata service wherever a translator or relay is on the path, so
with `0.0.0.0/0` and `::/0` they get what 127.0.0.1 gets: 403 on an IPv6 allocation, 443 on an
IPv4 one. CreatePermission, ChannelBind, Send and Connect (RFC 6062) answer alike, on TURN-UDP and
TURN-TCP listeners, from IPv4 and IPv6 clients, and IPv4-mapped peers are IPv4 peers in Connect
too.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aioice import stun
from fixtures.stunnerd.client import UdpTurnClient
from fixtures.stunnerd.tcp_client import (
    TRANSPORT_TCP,
    Credentials,
    TurnTcpConnection,
    bind_data_connection,
    tcp_echo,
)

from stunner_common.config import StunnerConfig, parse_config
from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.net.tcp_relay import bind_tcp_relay
from stunnerd.workers.local import LocalDataplane
from support.ports import free_udp_tcp_port, ipv6_loopback_available
from support.stun import CONNECT, aioice_knows_turn_attributes
from support.stunnerd_process import PASSWORD, REALM, USER, ManagedStunnerd, health_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

if not ipv6_loopback_available():
    pytest.skip(
        "this host has no IPv6 loopback (::1): no IPv6 relay to ask about IPv6 peers",
        allow_module_level=True,
    )

IPV4, IPV6 = 0x01, 0x02
UDP = 17 << 24
WILDCARD = ("0.0.0.0/0", "::/0")
STEP_S = 5.0

# (peer, answer on an IPv4 allocation, on an IPv6 one); None: admitted
PEERS: list[tuple[str, int | None, int | None]] = [
    ("::127.0.0.1", 443, 403),  # IPv4-compatible
    ("64:ff9b::7f00:1", 443, 403),  # NAT64 (RFC 6052)
    ("64:ff9b::a9fe:a9fe", 443, 403),  # NAT64 to the metadata service
    ("64:ff9b:1:7f00:0:100::", 443, 403),  # local-use NAT64 (RFC 8215)
    ("2002:7f00:1::", 443, 403),  # 6to4 (RFC 3056)
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", 443, 403),  # Teredo, client 127.0.0.1 (RFC 4380)
    ("::ffff:127.0.0.1", 403, 443),  # IPv4-mapped: an IPv4 peer
    ("127.0.0.1", 403, 443),
    ("::1", 443, 403),
    ("64:ff9b::c633:6409", 443, None),  # NAT64 to 198.51.100.9: the wildcard admits it
    ("2002:c633:6409::", 443, None),
    ("::ffff:198.51.100.9", None, 443),
]
REFUSED = [(peer, v4, v6) for peer, v4, v6 in PEERS if v4 is not None and v6 is not None]


@pytest.fixture(autouse=True)
def _turn_attributes() -> Iterator[None]:
    with aioice_knows_turn_attributes():
        yield


def wildcard_config(udp_port: int, tcp_port: int, endpoints: tuple[str, ...]) -> StunnerConfig:
    return parse_config(
        {
            "version": "v1",
            "auth": {
                "type": "static",
                "realm": REALM,
                "credentials": {"username": USER, "password": PASSWORD},
            },
            "listeners": [
                {
                    "name": "udp",
                    "protocol": "TURN-UDP",
                    "address": "127.0.0.1",
                    "port": udp_port,
                    "routes": ["everywhere"],
                },
                {
                    "name": "tcp",
                    "protocol": "TURN-TCP",
                    "address": "127.0.0.1",
                    "port": tcp_port,
                    "routes": ["everywhere"],
                },
            ],
            "clusters": [{"name": "everywhere", "type": "STATIC", "endpoints": list(endpoints)}],
        }
    )


@contextlib.asynccontextmanager
async def serving(
    endpoints: tuple[str, ...] = WILDCARD,
) -> AsyncIterator[tuple[LocalDataplane, dict[str, int]]]:
    """A TURN-UDP and a TURN-TCP listener on `::` (IPv4 and IPv6 clients), relaying from
    127.0.0.1 and ::1."""
    ports = {"udp": free_udp_tcp_port(), "tcp": free_udp_tcp_port()}
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="::", relay_addresses=("::1",))))
    try:
        await dataplane.reconciler.apply(wildcard_config(ports["udp"], ports["tcp"], endpoints))
        yield dataplane, ports
    finally:
        await dataplane.close()


class UdpClient(UdpTurnClient):
    async def open(self, local: str) -> None:
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.create_datagram_endpoint(
            lambda: self.proto, local_addr=(local, 0)
        )

    async def code(self, method: int, attrs: dict[str, Any]) -> int | None:
        reply = await self.request(stun.Method(method), attrs)
        return reply.error_code if reply.message_class == stun.Class.ERROR else None


class TcpClient:
    """The RFC 6062 test client, asked for error codes like `UdpClient`."""

    def __init__(self, conn: TurnTcpConnection) -> None:
        self.conn = conn

    async def code(self, method: int, attrs: dict[str, Any]) -> int | None:
        return (await self.conn.request(method, attrs)).error_code

    def send_raw(self, data: bytes) -> None:
        self.conn.writer.write(data)


@contextlib.asynccontextmanager
async def client(transport: str, host: str, ports: dict[str, int]) -> AsyncIterator[Any]:
    if transport == "udp":
        udp = UdpClient((host, ports["udp"]))
        await udp.open(host)
        try:
            yield udp
        finally:
            assert udp.transport is not None
            udp.transport.close()
        return
    conn = await TurnTcpConnection.open((host, ports["tcp"]), Credentials())
    try:
        yield TcpClient(conn)
    finally:
        await conn.close()


def send_indication(peer: tuple[str, int]) -> bytes:
    msg = stun.Message(stun.Method.SEND, stun.Class.INDICATION)
    msg.attributes.update({"XOR-PEER-ADDRESS": peer, "DATA": b"to loopback?"})
    return bytes(msg)


@pytest.mark.parametrize("transport", ["udp", "tcp"])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"], ids=["ipv4-client", "ipv6-client"])
@pytest.mark.parametrize("family", [IPV4, IPV6], ids=["ipv4-allocation", "ipv6-allocation"])
async def test_create_permission_channel_bind_and_send_judge_embedded_peers_alike(
    no_leaked_tasks: None, transport: str, host: str, family: int
) -> None:
    async with serving() as (dataplane, ports), client(transport, host, ports) as turn:
        allocate = {"REQUESTED-TRANSPORT": UDP, "REQUESTED-ADDRESS-FAMILY": family}
        assert await turn.code(stun.Method.ALLOCATE, allocate) is None
        channel = 0x4000
        for peer, on_ipv4, on_ipv6 in PEERS:
            expected = on_ipv4 if family == IPV4 else on_ipv6
            address = (peer, 9000)
            permit = {"XOR-PEER-ADDRESS": address}
            assert await turn.code(stun.Method.CREATE_PERMISSION, permit) == expected, peer
            bind = {"CHANNEL-NUMBER": channel, "XOR-PEER-ADDRESS": address}
            assert await turn.code(stun.Method.CHANNEL_BIND, bind) == expected, peer
            if expected is None:
                channel += 1
        # a Send indication to any refused peer is dropped (no permission, no route)
        engine = dataplane.server.listeners[transport].engine
        before = engine.stats_dropped
        refused = [(p, v4 if family == IPV4 else v6) for p, v4, v6 in PEERS]
        refused_peers = [p for p, code in refused if code is not None]
        for peer in refused_peers:
            turn.send_raw(send_indication((peer, 9000)))
        # the answer to a request sent after them means the indications were read
        assert await turn.code(stun.Method.REFRESH, {}) is None
        assert engine.stats_dropped == before + len(refused_peers)
        allocation = next(iter(engine.allocations.values()))
        admitted = {p for p, code in refused if code is None}
        assert set(allocation.permissions) == {str(p).removeprefix("::ffff:") for p in admitted}


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"], ids=["ipv4-client", "ipv6-client"])
@pytest.mark.parametrize("family", [IPV4, IPV6], ids=["ipv4-allocation", "ipv6-allocation"])
async def test_connect_answers_embedded_and_mapped_peers_as_create_permission_does(
    no_leaked_tasks: None, host: str, family: int
) -> None:
    async with serving() as (_dataplane, ports):
        conn = await TurnTcpConnection.open((host, ports["tcp"]), Credentials())
        try:
            allocate = {"REQUESTED-TRANSPORT": TRANSPORT_TCP, "REQUESTED-ADDRESS-FAMILY": family}
            assert (await conn.request(int(stun.Method.ALLOCATE), allocate)).error_code is None
            for peer, on_ipv4, on_ipv6 in REFUSED:
                expected = on_ipv4 if family == IPV4 else on_ipv6
                connected = await conn.request(CONNECT, {"XOR-PEER-ADDRESS": (peer, 9000)})
                assert connected.error_code == expected, peer
                permit = await conn.request(
                    int(stun.Method.CREATE_PERMISSION), {"XOR-PEER-ADDRESS": (peer, 9000)}
                )
                assert permit.error_code == expected, peer
        finally:
            await conn.close()


async def test_connect_to_an_ipv4_mapped_peer_reaches_it_as_ipv4(no_leaked_tasks: None) -> None:
    """The peer named by its mapped form is connected to over IPv4, from the IPv4 relay; an
    IPv6 TCP allocation gets 443 for it, as CreatePermission gives."""
    async with serving(("127.0.0.1/32", "::/0")) as (_dataplane, ports), tcp_echo() as echo:
        server = ("127.0.0.1", ports["tcp"])
        creds = Credentials()
        control = await TurnTcpConnection.open(server, creds)
        six = await TurnTcpConnection.open(server, Credentials())
        try:
            allocated = await control.allocate_tcp()
            assert allocated.error_code is None
            relay = allocated.attributes["XOR-RELAYED-ADDRESS"]
            mapped = (f"::ffff:{echo.addr[0]}", echo.addr[1])
            connected = await control.connect(mapped)
            assert connected.error_code is None
            data, bound = await bind_data_connection(
                server, creds, connected.attributes["CONNECTION-ID"]
            )
            assert bound.error_code is None
            data.writer.write(b"ping")
            async with asyncio.timeout(STEP_S):
                assert await data.reader.readexactly(4) == b"ping"
            assert echo.sources == [tuple(relay)]
            await data.close()
            allocate6 = {"REQUESTED-TRANSPORT": TRANSPORT_TCP, "REQUESTED-ADDRESS-FAMILY": IPV6}
            assert (await six.request(int(stun.Method.ALLOCATE), allocate6)).error_code is None
            assert (await six.connect(mapped)).error_code == 443
            assert echo.sources == [tuple(relay)]
        finally:
            await six.close()
            await control.close()


def test_an_ipv6_tcp_relay_takes_no_ipv4_connections() -> None:
    """IPv6 TCP relays are IPv6-only like UDP ones: an IPv4 peer cannot arrive as a mapped one."""
    with contextlib.closing(bind_tcp_relay("::", 6)) as sock:
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1


async def test_the_stunnerd_command_refuses_the_probed_peers_and_says_why(tmp_path: Path) -> None:
    """The probe's three addresses against the `stunnerd` process with the wildcard routes."""
    port = free_udp_tcp_port()
    config = wildcard_config(port, free_udp_tcp_port(), WILDCARD).to_dict()
    config["listeners"] = [lst for lst in config["listeners"] if lst["name"] == "udp"]
    config["admin"] = {
        "name": "default/wildcard",
        "loglevel": "all:INFO",
        "healthcheck_endpoint": f"http://127.0.0.1:{health_port()}",
    }
    server = ManagedStunnerd(tmp_path, config, env={"STUNNERD_RELAY_ADDRESSES": "::1"})
    try:
        await server.ready()
        udp = UdpClient(("127.0.0.1", port))
        await udp.open("127.0.0.1")
        try:
            allocate = {"REQUESTED-TRANSPORT": UDP, "REQUESTED-ADDRESS-FAMILY": IPV6}
            assert await udp.code(stun.Method.ALLOCATE, allocate) is None
            for number, peer in enumerate(("::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::")):
                permit = {"XOR-PEER-ADDRESS": (peer, 80)}
                assert await udp.code(stun.Method.CREATE_PERMISSION, permit) == 403
                bind = {"CHANNEL-NUMBER": 0x4000 + number, "XOR-PEER-ADDRESS": (peer, 80)}
                assert await udp.code(stun.Method.CHANNEL_BIND, bind) == 403
        finally:
            assert udp.transport is not None
            udp.transport.close()
        # a source's 403s are logged once a minute: the first one, the IPv4-compatible peer
        note = "carries 127.0.0.1 (IPv4-compatible, RFC 4291 §2.5.5.1), in protected range"
        async with asyncio.timeout(STEP_S):
            while note not in server.log():  # noqa: ASYNC110 - the log is a file
                await asyncio.sleep(0.05)
        assert "peer [::7f00:1]:80 is admitted by no route (routes considered: everywhere" in (
            server.log()
        )
    finally:
        await server.close()
