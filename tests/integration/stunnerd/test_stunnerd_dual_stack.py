"""Dual stack on real loopback sockets: a listener on `::` for IPv4 and IPv6 clients, IPv6 relays,
and dual allocations (ADDITIONAL-ADDRESS-FAMILY) relaying to an echo peer on 127.0.0.1 and one on
::1, through the Python relay and through the C fast path."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aioice import stun
from fixtures.stunnerd.client import UdpTurnClient

from stunner_common.config import StunnerConfig, parse_config, self_signed_pair
from stunnerd import fastpath
from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.net.tuning import ServerTuning
from stunnerd.workers.local import LocalDataplane
from support.echo import UdpEcho, udp_echo
from support.ports import free_udp_tcp_port, ipv6_loopback_available
from support.stun import aioice_knows_turn_attributes
from support.stunnerd_process import PASSWORD, REALM, USER, ManagedStunnerd, health_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

IPV4, IPV6 = 0x01, 0x02


if not ipv6_loopback_available():
    pytest.skip("this host has no IPv6 loopback (::1)", allow_module_level=True)


def dual_config(port: int, endpoints: tuple[str, ...] = ("127.0.0.1", "::1")) -> StunnerConfig:
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
                    "name": "dual",
                    "protocol": "TURN-UDP",
                    "address": "127.0.0.1",
                    "port": port,
                    "routes": ["echo"],
                }
            ],
            "clusters": [{"name": "echo", "type": "STATIC", "endpoints": list(endpoints)}],
        }
    )


@contextlib.asynccontextmanager
async def dual_stack_server(
    *, use_fastpath: bool = False, endpoints: tuple[str, ...] = ("127.0.0.1", "::1")
) -> AsyncIterator[tuple[LocalDataplane, int]]:
    """A listener on [::]:port (IPv4 clients too) advertising 127.0.0.1 and ::1 as relays."""
    port = free_udp_tcp_port()
    server = TurnServer(
        ServerOptions(
            bind_host="::", relay_addresses=("::1",), tuning=ServerTuning(fastpath=use_fastpath)
        )
    )
    dataplane = LocalDataplane(server)
    try:
        await dataplane.reconciler.apply(dual_config(port, endpoints))
        yield dataplane, port
    finally:
        await dataplane.close()


class RawClient(UdpTurnClient):
    """aioice's client, keeping the last answer's bytes (a dual answer repeats an attribute)."""

    last: bytes = b""

    async def open(self, local: str) -> None:
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.create_datagram_endpoint(
            lambda: self.proto, local_addr=(local, 0)
        )

    async def transact(self, msg: stun.Message) -> stun.Message:
        self.send_raw(bytes(msg))
        while True:
            data = await self.recv_raw()
            reply = stun.parse_message(data)
            if reply.transaction_id == msg.transaction_id:
                self.last = data
                return reply

    def relayed(self) -> list[tuple[str, int]]:
        out, pos, tid = [], 20, self.last[8:20]
        while pos + 4 <= len(self.last):
            kind, length = struct.unpack_from("!HH", self.last, pos)
            if kind == 0x0016:
                out.append(stun.unpack_xor_address(self.last[pos + 4 : pos + 4 + length], tid))
            pos += 4 + length + (-length % 4)
        return out

    async def ok(self, method: stun.Method, attrs: dict[str, Any]) -> stun.Message:
        reply = await self.request(method, attrs)
        assert reply.message_class == stun.Class.RESPONSE, (reply.error_code, reply.attributes)
        return reply

    async def code(self, method: stun.Method, attrs: dict[str, Any]) -> int | None:
        reply = await self.request(method, attrs)
        return reply.error_code if reply.message_class == stun.Class.ERROR else None


@contextlib.asynccontextmanager
async def client_at(port: int, local: str) -> AsyncIterator[RawClient]:
    server = ("::1" if ":" in local else "127.0.0.1", port)
    client = RawClient(server)
    await client.open(local)
    try:
        with aioice_knows_turn_attributes():
            yield client
    finally:
        assert client.transport is not None
        client.transport.close()


def channel_data(channel: int, payload: bytes) -> bytes:
    return struct.pack("!HH", channel, len(payload)) + payload


async def echoed_through_channel(
    client: RawClient, channel: int, echo: UdpEcho, payload: bytes
) -> None:
    await client.ok(
        stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": channel, "XOR-PEER-ADDRESS": echo.addr}
    )
    client.send_raw(channel_data(channel, payload))
    assert await client.recv_raw() == channel_data(channel, payload)


FASTPATH = [False, *([True] if fastpath.available() else [])]


@pytest.mark.parametrize("use_fastpath", FASTPATH, ids=lambda on: "c-fastpath" if on else "python")
async def test_dual_allocation_relays_to_an_ipv4_and_an_ipv6_peer(
    no_leaked_tasks: None, use_fastpath: bool
) -> None:
    async with (
        dual_stack_server(use_fastpath=use_fastpath) as (dataplane, port),
        udp_echo("127.0.0.1") as echo4,
        udp_echo("::1") as echo6,
        client_at(port, "127.0.0.1") as client,
    ):
        reply = await client.ok(
            stun.Method.ALLOCATE,
            {"REQUESTED-TRANSPORT": 17 << 24, "ADDITIONAL-ADDRESS-FAMILY": IPV6},
        )
        relay4, relay6 = client.relayed()
        assert relay4[0] == "127.0.0.1"
        assert relay6[0] == "::1"
        # the IPv4 client reached a socket on ::, yet sees its own IPv4 address
        assert reply.attributes["XOR-MAPPED-ADDRESS"][0] == "127.0.0.1"
        await echoed_through_channel(client, 0x4000, echo4, b"over four")
        await echoed_through_channel(client, 0x4001, echo6, b"over six")
        # a Send indication takes the relay of the peer's family as well (the echo comes back
        # on the channel bound to that peer)
        send = stun.Message(stun.Method.SEND, stun.Class.INDICATION)
        send.attributes.update({"XOR-PEER-ADDRESS": echo6.addr, "DATA": b"indicated"})
        client.send_raw(bytes(send))
        assert await client.recv_raw() == channel_data(0x4001, b"indicated")
        # each peer saw the relay address of its own family, and only that
        assert echo4.protocol.sources == {relay4}
        assert echo6.protocol.sources == {relay6}
        assert dataplane.server.allocation_counts() == {"dual": 1}
        await client.ok(stun.Method.REFRESH, {"LIFETIME": 0})  # both relays close
        listener = dataplane.server.listeners["dual"]
        assert listener.relays == {}
        assert listener.dual_relays == {}


async def test_ipv6_client_gets_an_ipv6_relay_and_reaches_an_ipv6_peer(
    no_leaked_tasks: None,
) -> None:
    async with (
        dual_stack_server() as (_dataplane, port),
        udp_echo("::1") as echo6,
        client_at(port, "::1") as client,
    ):
        await client.ok(
            stun.Method.ALLOCATE,
            {"REQUESTED-TRANSPORT": 17 << 24, "REQUESTED-ADDRESS-FAMILY": IPV6},
        )
        assert [ip for ip, _ in client.relayed()] == ["::1"]
        await echoed_through_channel(client, 0x4000, echo6, b"six")
        permit = stun.Method.CREATE_PERMISSION
        assert await client.code(permit, {"XOR-PEER-ADDRESS": ("127.0.0.1", 9)}) == 443
        assert await client.code(permit, {"XOR-PEER-ADDRESS": ("::ffff:127.0.0.1", 9)}) == 443


async def test_an_ipv6_peer_outside_every_route_gets_403_and_receives_nothing(
    no_leaked_tasks: None,
) -> None:
    async with (
        dual_stack_server(endpoints=("127.0.0.1", "::1/128:<1-1023>")) as (_dataplane, port),
        udp_echo("::1") as echo6,
        client_at(port, "::1") as client,
    ):
        await client.ok(
            stun.Method.ALLOCATE,
            {"REQUESTED-TRANSPORT": 17 << 24, "REQUESTED-ADDRESS-FAMILY": IPV6},
        )
        bind = {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": echo6.addr}  # port above 1023
        assert await client.code(stun.Method.CHANNEL_BIND, bind) == 403
        outside = {"XOR-PEER-ADDRESS": ("2001:db8::1", 9)}
        assert await client.code(stun.Method.CREATE_PERMISSION, outside) == 403
        send = stun.Message(stun.Method.SEND, stun.Class.INDICATION)
        send.attributes.update({"XOR-PEER-ADDRESS": echo6.addr, "DATA": b"no"})
        client.send_raw(bytes(send))
        assert await client.nothing_arrives()
        assert echo6.protocol.received == 0


async def test_dual_allocation_without_an_ipv6_relay_address_gets_ipv4_and_address_error(
    no_leaked_tasks: None,
) -> None:
    port = free_udp_tcp_port()
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="127.0.0.1")))
    try:
        await dataplane.reconciler.apply(dual_config(port))
        async with client_at(port, "127.0.0.1") as client:
            await client.ok(
                stun.Method.ALLOCATE,
                {"REQUESTED-TRANSPORT": 17 << 24, "ADDITIONAL-ADDRESS-FAMILY": IPV6},
            )
            assert [ip for ip, _ in client.relayed()] == ["127.0.0.1"]
            assert b"\x80\x01" in client.last  # ADDRESS-ERROR-CODE
            assert dataplane.server.listeners["dual"].dual_relays == {}
    finally:
        await dataplane.close()


def binding_over(protocol: str, host: str, port: int) -> tuple[bytes, tuple[str, int]]:
    """One STUN Binding from `host` over a plain socket (TLS: unverified); answer, local addr."""
    binding = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
    kind = socket.SOCK_DGRAM if protocol == "TURN-UDP" else socket.SOCK_STREAM
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as raw:
        raw.settimeout(5)
        raw.connect((host, port))
        sock = raw
        if protocol == "TURN-TLS":
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            sock = context.wrap_socket(raw)
        sock.sendall(bytes(binding))
        return sock.recv(2048), sock.getsockname()[:2]


@pytest.mark.parametrize("protocol", ["TURN-UDP", "TURN-TCP", "TURN-TLS"])
async def test_a_listener_on_the_ipv6_wildcard_answers_ipv4_and_ipv6_clients(
    no_leaked_tasks: None, protocol: str
) -> None:
    """Bound to `::` (whatever net.ipv6.bindv6only says), each client sees its own address."""
    port = free_udp_tcp_port()
    listener: dict[str, Any] = {"name": "any", "protocol": protocol, "address": "::1", "port": port}
    if protocol == "TURN-TLS":
        listener["cert"], listener["key"] = self_signed_pair("localhost")
    config = parse_config({**dual_config(port).to_dict(), "listeners": [listener]})
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="::")))
    try:
        await dataplane.reconciler.apply(config)
        for host in ("127.0.0.1", "::1"):
            answer, local = await asyncio.to_thread(binding_over, protocol, host, port)
            reply = stun.parse_message(answer)
            assert reply.attributes["XOR-MAPPED-ADDRESS"] == local
    finally:
        await dataplane.close()


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_the_stunnerd_command_takes_its_relay_addresses_from_the_environment(
    tmp_path: Path, workers: str
) -> None:
    """STUNNERD_RELAY_ADDRESSES reaches the listeners of the process and of its workers."""
    port = free_udp_tcp_port()
    config = dual_config(port).to_dict()
    config["admin"] = {
        "name": "default/dual",
        "healthcheck_endpoint": f"http://127.0.0.1:{health_port()}",
    }
    server = ManagedStunnerd(
        tmp_path,
        config,
        "--udp-thread-num",
        workers,
        env={"STUNNERD_RELAY_ADDRESSES": "::1", "STUNNERD_BIND_HOST": "::"},
    )
    try:
        await server.ready()
        async with client_at(port, "127.0.0.1") as client:
            await client.ok(
                stun.Method.ALLOCATE,
                {"REQUESTED-TRANSPORT": 17 << 24, "ADDITIONAL-ADDRESS-FAMILY": IPV6},
            )
            assert [ip for ip, _ in client.relayed()] == ["127.0.0.1", "::1"]
    finally:
        await server.close()
