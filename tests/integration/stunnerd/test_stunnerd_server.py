"""The asyncio edge on real loopback sockets: admission, quota, stream close, live updates."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import ssl

import pytest
from aioice import stun
from cryptography import x509
from fixtures.stunnerd.client import UdpTurnClient
from fixtures.stunnerd.inproc import make_config, running_dataplane, running_server

from stunner_common.config import parse_config, self_signed_pair
from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.net.tuning import ServerTuning
from stunnerd.workers.local import LocalDataplane
from support.echo import echo_peer, udp_echo
from support.ports import ipv6_loopback_available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def server_addr(config: object, index: int = 0) -> tuple[str, int]:
    return ("127.0.0.1", config.listeners[index].port)  # type: ignore[attr-defined]


def channel_data(channel: int, payload: bytes) -> bytes:
    return channel.to_bytes(2, "big") + len(payload).to_bytes(2, "big") + payload


async def test_allocation_advertises_the_listener_address_and_relays_channel_data(
    no_leaked_tasks: None,
) -> None:
    config = make_config()
    async with (
        running_server(config) as server,
        echo_peer() as (peer, peer_addr),
        UdpTurnClient(server_addr(config)) as client,
    ):
        reply = await client.allocate()
        assert reply.message_class == stun.Class.RESPONSE
        relay = reply.attributes["XOR-RELAYED-ADDRESS"]
        assert relay[0] == "127.0.0.1"
        bound = await client.request(
            stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer_addr}
        )
        assert bound.message_class == stun.Class.RESPONSE
        client.send_raw(channel_data(0x4000, b"hello"))
        assert await client.recv_raw() == channel_data(0x4000, b"hello")
        assert peer.senders == [relay]
        assert server.allocation_counts() == {"turn-udp": 1}


async def test_peer_outside_every_route_gets_403_and_nothing_is_relayed(
    no_leaked_tasks: None,
) -> None:
    config = make_config(endpoints=("10.0.0.0/8",))
    async with (
        running_server(config),
        echo_peer() as (peer, peer_addr),
        UdpTurnClient(server_addr(config)) as client,
    ):
        await client.allocate()
        reply = await client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": peer_addr})
        assert reply.error_code == 403
        reply = await client.request(
            stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer_addr}
        )
        assert reply.error_code == 403
        client.send_raw(channel_data(0x4000, b"x"))
        assert await client.nothing_arrives()
        assert peer.senders == []


async def test_peer_port_outside_the_range_gets_a_permission_but_no_channel_and_no_data(
    no_leaked_tasks: None,
) -> None:
    async with echo_peer() as (peer, peer_addr):
        other = peer_addr[1] + 1 if peer_addr[1] < 65535 else peer_addr[1] - 1
        config = make_config(endpoints=(f"127.0.0.1:<{other}-{other}>",))
        async with running_server(config), UdpTurnClient(server_addr(config)) as client:
            await client.allocate()
            reply = await client.request(
                stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": peer_addr}
            )
            assert reply.message_class == stun.Class.RESPONSE  # permissions are per IP
            reply = await client.request(
                stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4001, "XOR-PEER-ADDRESS": peer_addr}
            )
            assert reply.error_code == 403
            indication = stun.Message(stun.Method.SEND, stun.Class.INDICATION)
            indication.attributes["XOR-PEER-ADDRESS"] = peer_addr
            indication.attributes["DATA"] = b"x"
            client.send_raw(bytes(indication))
            client.send_raw(channel_data(0x4001, b"x"))
            assert await client.nothing_arrives()
            assert peer.senders == []


async def test_route_changes_apply_to_live_allocations_without_restart(
    no_leaked_tasks: None,
) -> None:
    config = make_config()
    closed = parse_config(
        {**config.to_dict(), "clusters": [{"name": "loopback", "endpoints": ["10.0.0.0/8"]}]}
    )
    async with (
        running_server(config) as server,
        echo_peer() as (peer, peer_addr),
        UdpTurnClient(server_addr(config)) as client,
    ):
        await client.allocate()
        await client.request(
            stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4002, "XOR-PEER-ADDRESS": peer_addr}
        )
        listener = server.listeners["turn-udp"]
        server.apply_policies(closed)
        client.send_raw(channel_data(0x4002, b"blocked"))
        assert await client.nothing_arrives()
        server.apply_policies(config)
        client.send_raw(channel_data(0x4002, b"open"))
        assert await client.recv_raw() == channel_data(0x4002, b"open")
        assert server.listeners["turn-udp"] is listener
        assert server.allocation_count == 1
        assert len(peer.senders) == 1


async def test_quota_refuses_a_second_allocation_of_the_same_user_with_486(
    no_leaked_tasks: None,
) -> None:
    config = make_config(user_quota=1)
    async with (
        running_server(config),
        UdpTurnClient(server_addr(config)) as first,
        UdpTurnClient(server_addr(config)) as second,
    ):
        assert (await first.allocate()).message_class == stun.Class.RESPONSE
        assert (await second.allocate()).error_code == 486


async def test_garbage_never_takes_the_listener_down(no_leaked_tasks: None) -> None:
    config = make_config()
    async with running_server(config) as server, UdpTurnClient(server_addr(config)) as client:
        for size in (0, 1, 3, 4, 19, 20, 21, 64, 1500):
            client.send_raw(os.urandom(size))
        client.send_raw(b"\x40\x00\xff\xff")  # ChannelData longer than the datagram
        client.send_raw(b"\x00\x01\x00\x04\x21\x12\xa4\x42" + os.urandom(12) + b"\x00\x01\x00")
        reply = await client.request(stun.Method.BINDING)
        assert reply.message_class == stun.Class.RESPONSE
        assert server.allocation_count == 0


async def test_closing_a_tcp_connection_deletes_its_allocation(no_leaked_tasks: None) -> None:
    config = make_config(("TURN-TCP",))
    async with running_server(config) as server:
        reader, writer = await asyncio.open_connection(*server_addr(config))
        try:
            challenge = stun.Message(
                stun.Method.ALLOCATE,
                stun.Class.REQUEST,
                attributes={"REQUESTED-TRANSPORT": 17 << 24},
            )
            writer.write(bytes(challenge))
            async with asyncio.timeout(5):
                head = await reader.readexactly(20)
                body = await reader.readexactly(int.from_bytes(head[2:4], "big"))
            reply = stun.parse_message(head + body)
            assert reply.error_code == 401
            client = UdpTurnClient(("", 0))
            client.realm, client.nonce = reply.attributes["REALM"], reply.attributes["NONCE"]
            signed = stun.Message(
                stun.Method.ALLOCATE,
                stun.Class.REQUEST,
                attributes={
                    "REQUESTED-TRANSPORT": 17 << 24,
                    "USERNAME": client.username,
                    "REALM": client.realm,
                    "NONCE": client.nonce,
                },
            )
            signed.add_message_integrity(client.key)
            writer.write(bytes(signed))
            async with asyncio.timeout(5):
                head = await reader.readexactly(20)
                body = await reader.readexactly(int.from_bytes(head[2:4], "big"))
            assert stun.parse_message(head + body).message_class == stun.Class.RESPONSE
            assert server.allocation_count == 1
        finally:
            writer.close()
            await writer.wait_closed()
        async with asyncio.timeout(5):
            while server.allocation_count:  # noqa: ASYNC110 - the server notices the FIN
                await asyncio.sleep(0.01)


async def test_listeners_can_be_added_and_removed_while_running(no_leaked_tasks: None) -> None:
    config = make_config(("TURN-UDP",))
    both = make_config(("TURN-UDP", "TURN-TCP"))
    tcp = next(lst for lst in both.listeners if lst.name == "turn-tcp")
    listeners = [config.listeners[0].to_dict(), tcp.to_dict()]
    both = parse_config({**both.to_dict(), "listeners": listeners})
    async with running_dataplane(config) as dataplane:
        server = dataplane.server
        udp = server.listeners["turn-udp"]
        await dataplane.reconciler.apply(both)
        assert set(server.listeners) == {"turn-udp", "turn-tcp"}
        assert server.listeners["turn-udp"] is udp
        with socket.create_connection(("127.0.0.1", tcp.port), timeout=2):
            pass
        await dataplane.reconciler.apply(config)
        assert set(server.listeners) == {"turn-udp"}


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback here")
async def test_ipv6_listener_relays_to_an_ipv6_peer(no_leaked_tasks: None) -> None:
    from support.ports import free_port

    port = free_port(socket.SOCK_DGRAM, "::1")
    config = parse_config(
        {
            "version": "v1",
            "auth": {"credentials": {"username": "user1", "password": "passwd1"}},
            "listeners": [
                {"name": "v6", "protocol": "TURN-UDP", "address": "::1", "port": port,
                 "routes": ["c"]}
            ],
            "clusters": [{"name": "c", "endpoints": ["::1/128"]}],
        }
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="::1")))
    async with udp_echo("::1") as peer_echo:
        peer = peer_echo.addr
        try:
            await dataplane.reconciler.apply(config)
            client = UdpTurnClient(("::1", port))
            client.transport, _ = await loop.create_datagram_endpoint(
                lambda: client.proto, local_addr=("::1", 0)
            )
            try:
                reply = await client.allocate()
                assert reply.attributes["XOR-RELAYED-ADDRESS"][0] == "::1"
                bound = await client.request(
                    stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer}
                )
                assert bound.message_class == stun.Class.RESPONSE
                listener = dataplane.server.listeners["v6"]
                # the fast path is armed (the client as an IPv6 transport gives it: 4 fields)
                assert any(
                    isinstance(key[0], tuple) and len(key[0]) == 4 for key in listener.routes
                )
                client.send_raw(channel_data(0x4000, b"six"))
                assert await client.recv_raw() == channel_data(0x4000, b"six")
            finally:
                client.transport.close()
        finally:
            await dataplane.close()


async def test_strict_dns_cluster_admits_the_addresses_its_name_resolves_to(
    no_leaked_tasks: None,
) -> None:
    base = make_config()
    config = parse_config(
        {
            **base.to_dict(),
            "clusters": [{"name": "loopback", "type": "STRICT_DNS", "endpoints": ["localhost"]}],
        }
    )
    async with (
        running_server(config) as server,
        echo_peer() as (_peer, peer_addr),
        UdpTurnClient(server_addr(config)) as client,
    ):
        async with asyncio.timeout(10):
            while "127.0.0.1" not in server.dns.addresses.get("localhost", ()):  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # the resolver task answers within a loop turn or two
        await client.allocate()
        reply = await client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": peer_addr})
        assert reply.message_class == stun.Class.RESPONSE
        reply = await client.request(
            stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": ("10.1.2.3", 9)}
        )
        assert reply.error_code == 403


async def test_rotating_the_tls_certificate_serves_new_connections_with_the_new_one(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TLS",))
    listener = config.listeners[0]

    async def served_certificate() -> bytes:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        async with asyncio.timeout(5):
            _reader, writer = await asyncio.open_connection("127.0.0.1", listener.port, ssl=ctx)
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        finally:
            writer.close()
            await writer.wait_closed()
        return bytes(der)

    cert, key = self_signed_pair("127.0.0.2")
    rotated = listener.model_copy(update={"cert": cert, "key": key})
    async with running_server(config) as server:
        before = await served_certificate()
        assert server.rotate_certificate(rotated)
        after = await served_certificate()
    new_der = x509.load_pem_x509_certificate(base64.b64decode(cert)).public_bytes(
        __import__(
            "cryptography.hazmat.primitives.serialization", fromlist=["Encoding"]
        ).Encoding.DER
    )
    assert after == new_der
    assert before != after


async def test_a_silent_tcp_connection_without_allocation_is_closed(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TCP",))
    async with running_server(config, tuning=ServerTuning(client_idle_timeout_s=0.05)) as server:
        reader, writer = await asyncio.open_connection(*server_addr(config))
        try:
            async with asyncio.timeout(5):
                assert await reader.read() == b""  # the server hung up
            assert server.listeners["turn-tcp"].connections == 0
        finally:
            writer.close()
            await writer.wait_closed()


async def test_routed_channel_data_is_counted_exactly_on_the_listener_and_the_cluster(
    no_leaked_tasks: None,
) -> None:
    config = make_config()
    async with (
        running_server(config) as server,
        echo_peer() as (_peer, peer_addr),
        UdpTurnClient(server_addr(config)) as client,
    ):
        await client.allocate()
        await client.request(
            stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer_addr}
        )
        listener_before = list(server.listener_traffic["turn-udp"])
        assert server.cluster_traffic.get("loopback", [0, 0, 0, 0]) == [0, 0, 0, 0]
        sizes = [1, 10, 100, 1000]
        for size in sizes:
            frame = channel_data(0x4000, bytes(size))
            client.send_raw(frame)
            assert await client.recv_raw() == frame
        n, payload = len(sizes), sum(sizes)
        assert server.cluster_traffic["loopback"] == [n, payload, n, payload]
        rx_p, rx_b, tx_p, tx_b = server.listener_traffic["turn-udp"]
        assert (rx_p - listener_before[0], rx_b - listener_before[1]) == (n, payload + 4 * n)
        assert (tx_p - listener_before[2], tx_b - listener_before[3]) == (n, payload + 4 * n)
