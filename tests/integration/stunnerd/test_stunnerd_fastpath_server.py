"""TURN-UDP through the C relay of established channels, in this process on loopback.

The same client exchanges as the Python path: the C relay must relay exactly what the engine
routes, count it exactly, and forget a channel the moment the engine does.
"""

from __future__ import annotations

import json

import pytest
from aioice import stun
from fixtures.stunnerd.client import UdpTurnClient
from fixtures.stunnerd.inproc import make_config, running_server

from stunner_common.config import parse_config
from stunnerd import fastpath
from support.echo import echo_peer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

if not fastpath.available():
    pytest.skip("stunnerd._fastpath is not built", allow_module_level=True)


async def bind_channel(client: UdpTurnClient, peer: tuple[str, int]) -> tuple[str, int]:
    """Allocate and bind channel 0x4000 to `peer`; the relayed address."""
    relay = (await client.allocate()).attributes["XOR-RELAYED-ADDRESS"]
    bound = await client.request(
        stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer}
    )
    assert bound.message_class == stun.Class.RESPONSE
    return (relay[0], relay[1])


def channel_data(channel: int, payload: bytes) -> bytes:
    return channel.to_bytes(2, "big") + len(payload).to_bytes(2, "big") + payload


async def test_bound_channels_relay_through_c_and_are_counted_exactly(
    no_leaked_tasks: None,
) -> None:
    config = make_config()
    async with (
        running_server(config, fastpath=True) as server,
        echo_peer() as (peer, peer_addr),
        UdpTurnClient(("127.0.0.1", config.listeners[0].port)) as client,
    ):
        relay = await bind_channel(client, peer_addr)
        server.fold_counters()
        listener_before = list(server.listener_traffic["turn-udp"])
        sizes = [1, 10, 100, 1000]
        for size in sizes:
            frame = channel_data(0x4000, bytes(size))
            client.send_raw(frame)
            assert await client.recv_raw() == frame
        assert peer.senders == [relay] * len(sizes)
        stats = server.fastpath_stats
        assert stats is not None
        assert stats["relayed"] == 2 * len(sizes)
        assert (stats["client_routes"], stats["peer_routes"]) == (1, 1)
        server.fold_counters()
        n, payload = len(sizes), sum(sizes)
        assert server.cluster_traffic["loopback"] == [n, payload, n, payload]
        rx_p, rx_b, tx_p, tx_b = server.listener_traffic["turn-udp"]
        assert (rx_p - listener_before[0], rx_b - listener_before[1]) == (n, payload + 4 * n)
        assert (tx_p - listener_before[2], tx_b - listener_before[3]) == (n, payload + 4 * n)


async def test_a_deleted_allocation_and_a_withdrawn_route_stop_the_c_relay(
    no_leaked_tasks: None,
) -> None:
    config = make_config()
    async with (
        running_server(config, fastpath=True) as server,
        echo_peer() as (peer, peer_addr),
        UdpTurnClient(("127.0.0.1", config.listeners[0].port)) as client,
        UdpTurnClient(("127.0.0.1", config.listeners[0].port)) as other,
    ):
        for c in (client, other):
            await bind_channel(c, peer_addr)
            c.send_raw(channel_data(0x4000, b"up"))
            assert await c.recv_raw() == channel_data(0x4000, b"up")

        deleted = await client.request(stun.Method.REFRESH, {"LIFETIME": 0})
        assert deleted.message_class == stun.Class.RESPONSE
        stats = server.fastpath_stats
        assert stats is not None
        assert (stats["client_routes"], stats["peer_routes"]) == (1, 1)
        client.send_raw(channel_data(0x4000, b"gone"))
        assert await client.nothing_arrives()

        # A config whose cluster no longer admits the peer withdraws the other channel too.
        data = json.loads(config.canonical_json())
        data["clusters"][0]["endpoints"] = ["10.0.0.0/8"]
        server.apply_policies(parse_config(data))
        stats = server.fastpath_stats
        assert stats is not None
        assert stats["client_routes"] == 0
        other.send_raw(channel_data(0x4000, b"blocked"))
        assert await other.nothing_arrives()
        assert len(peer.senders) == 2, "only the two datagrams sent while routed reached the peer"


async def test_junk_is_dropped_in_c_while_stun_and_channels_keep_working(
    no_leaked_tasks: None,
) -> None:
    """Oversized, random and malformed datagrams never reach the engine; a Binding request
    between them is answered (in C) and a bound channel still relays."""
    config = make_config()
    async with (
        running_server(config, fastpath=True) as server,
        echo_peer() as (_peer, peer_addr),
        UdpTurnClient(("127.0.0.1", config.listeners[0].port)) as client,
    ):
        await bind_channel(client, peer_addr)
        before = server.fastpath_stats
        assert before is not None
        oversized = b"\x00\x03\xea\x4c\x21\x12\xa4\x42" + bytes(12) + bytes(60_000)
        junk = [oversized, bytes([0x80]) + bytes(1399), bytes([0x17]) + bytes(1399)]
        for datagram in junk:
            client.send_raw(datagram)
        binding = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
        client.send_raw(bytes(binding))
        answer = stun.parse_message(await client.recv_raw())
        assert answer.transaction_id == binding.transaction_id
        client.send_raw(channel_data(0x4000, b"still"))
        assert await client.recv_raw() == channel_data(0x4000, b"still")
        after = server.fastpath_stats
        assert after is not None
        assert after["dropped"] - before["dropped"] == len(junk)
        assert after["missed"] == before["missed"]  # the Binding request was answered in C
        assert after["answered"] - before["answered"] == 1


async def test_the_first_allocate_is_challenged_in_c_with_the_realm_in_force(
    no_leaked_tasks: None,
) -> None:
    """Each allocation's first Allocate (no credentials yet) is answered by C, and the client
    allocates with its nonce; a config that changes the realm, or turns TURN off, applies to the
    very next one."""
    config = make_config()
    async with (
        running_server(config, fastpath=True) as server,
        UdpTurnClient(("127.0.0.1", config.listeners[0].port)) as client,
    ):
        before = server.fastpath_stats
        assert before is not None
        await client.allocate()  # 401 from C, then the signed Allocate through the engine
        after = server.fastpath_stats
        assert after is not None
        assert after["challenged"] - before["challenged"] == 1
        assert after["missed"] - before["missed"] == 1  # only the signed Allocate

        async def challenge() -> stun.Message:
            request = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
            request.attributes["REQUESTED-TRANSPORT"] = 17 << 24
            client.send_raw(bytes(request))
            answer = stun.parse_message(await client.recv_raw())
            assert answer.transaction_id == request.transaction_id
            return answer

        data = json.loads(config.canonical_json())
        data["auth"]["realm"] = "elsewhere.example"
        server.apply_policies(parse_config(data))
        answer = await challenge()
        assert answer.attributes["ERROR-CODE"] == (401, "Unauthorized")
        assert answer.attributes["REALM"] == "elsewhere.example"
        stats = server.fastpath_stats
        assert stats is not None
        assert stats["challenged"] - after["challenged"] == 1

        data["auth"] = {"type": "none"}
        server.apply_policies(parse_config(data))
        assert (await challenge()).attributes["ERROR-CODE"][0] == 400  # the engine's refusal
