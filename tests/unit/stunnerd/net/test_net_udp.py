"""TURN-UDP on a fake socket: the client → peer fast path, the engine's slow path and timers.

The listener serves an inherited `FakeSocket` (as a worker serves the supervisor's), so nothing
is bound; relays are `FakeSocket`s too and the clock is `MockLoop`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from aioice import stun

from stunnerd.net.udp import UdpListener
from support import fake_listeners as kit
from support.fake_listeners import (
    CLIENT,
    OTHER,
    RelayPorts,
    TurnClient,
    client_at,
    feed,
    transport_of,
    udp_listener,
)
from support.fake_net import FakeSocket, MockLoop


@dataclass
class Channel:
    """A client with an allocation and a channel to `kit.PEER`."""

    listener: UdpListener
    sock: FakeSocket  # the listener's
    relay_sock: FakeSocket
    relay: Any  # the relay's protocol
    client: TurnClient


async def bound_channel(loop: MockLoop, ports: RelayPorts, lifetime_s: int = 600) -> Channel:
    listener, sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate(lifetime_s)
    client.channel_bind()
    [relay_sock] = ports.opened
    [(_transport, relay)] = loop.endpoints[1:]  # the first endpoint is the listener's own
    return Channel(listener, sock, relay_sock, relay, client)


async def test_a_binding_request_is_answered_on_the_listener_socket(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    assert listener.bound_port == 3478
    reply = client_at(listener, loop).exchange(kit.binding_request())
    assert reply.attributes["XOR-MAPPED-ADDRESS"] == CLIENT
    assert listener.traffic == [1, 20, 1, len(transport_of(listener).sent[0][0])]


async def test_routed_channel_data_goes_to_the_peer_through_the_relay_socket(
    loop: MockLoop, ports: RelayPorts
) -> None:
    ch = await bound_channel(loop, ports)
    answered = len(transport_of(ch.listener).sent)
    feed(ch.listener, kit.channel_data(b"media", pad=False))
    feed(ch.listener, kit.channel_data(b"media", pad=True))  # padding is allowed
    assert ch.relay_sock.sent == [(b"media", kit.PEER), (b"media", kit.PEER)]
    assert len(transport_of(ch.listener).sent) == answered


@pytest.mark.parametrize(
    ("datagram", "sender"),
    [
        (kit.channel_data(b"media", pad=False)[:-1], CLIENT),  # shorter than its header says
        (kit.channel_data(b"media", channel=0x4001, pad=False), CLIENT),  # an unbound channel
        (kit.channel_data(b"spoofed", pad=False), OTHER),  # the channel of another client
    ],
)
async def test_channel_data_without_its_own_route_is_not_relayed(
    loop: MockLoop, ports: RelayPorts, datagram: bytes, sender: tuple[str, int]
) -> None:
    ch = await bound_channel(loop, ports)
    feed(ch.listener, datagram, sender)
    assert ch.relay_sock.sent == []


async def test_an_oversized_datagram_is_counted_and_dropped(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    size = listener.limits.request.max_udp_datagram_bytes + 1
    request = kit.binding_request()
    feed(listener, request + bytes(size - len(request)))
    assert transport_of(listener).sent == []
    assert listener.traffic[:2] == [1, size]


async def test_a_peer_datagram_reaches_the_client_as_channel_data_on_the_listener_socket(
    loop: MockLoop, ports: RelayPorts
) -> None:
    ch = await bound_channel(loop, ports)
    ch.relay.datagram_received(b"abcde", kit.PEER)
    assert ch.sock.sent == [(kit.channel_data(b"abcde", pad=False), CLIENT)]  # unpadded


async def test_a_peer_without_a_channel_reaches_the_client_in_a_data_indication(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate()
    reply = client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": kit.PEER})
    assert reply.message_class == stun.Class.RESPONSE
    [(_t, relay)] = loop.endpoints[1:]
    relay.datagram_received(b"hello", kit.PEER)
    data, to = transport_of(listener).sent[-1]
    indication = stun.parse_message(data)
    assert to == CLIENT
    assert indication.message_method == stun.Method.DATA
    assert indication.attributes["DATA"] == b"hello"


async def test_a_malformed_datagram_leaves_other_clients_alone(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate()
    for junk in (b"\x00", b"\x00\x01\x00\x08" + bytes(16), b"\xff" * 40, bytes(20)):
        feed(listener, junk, OTHER)
    assert [to for _d, to in transport_of(listener).sent].count(OTHER) == 0
    client.channel_bind()
    assert listener.allocation_count == 1


async def test_an_allocation_expires_on_the_listener_timer(
    loop: MockLoop, ports: RelayPorts
) -> None:
    ch = await bound_channel(loop, ports, lifetime_s=600)
    assert ch.listener.connections == 1
    loop.advance(599)
    assert ch.listener.allocation_count == 1
    loop.advance(2)
    assert ch.listener.allocation_count == 0
    assert ch.relay_sock.closed
    assert ch.listener.routes == {}
    assert ch.listener.relays == {}
    assert ch.listener.connections == 0
    assert ch.listener.connections_total == 1


async def test_a_relay_socket_that_cannot_be_bound_is_answered_508(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)

    def no_ports(*_args: object) -> FakeSocket:
        raise OSError(98, "Address already in use")

    listener.opener.bind_socket = no_ports  # type: ignore[assignment]
    client = client_at(listener, loop)
    reply = client.request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
    assert reply.error_code == 508
    assert listener.allocation_count == 0
    assert listener.connections == 0


async def test_closing_the_listener_closes_relays_and_socket_once(
    loop: MockLoop, ports: RelayPorts
) -> None:
    ch = await bound_channel(loop, ports)
    await ch.listener.close()
    await ch.listener.close()
    assert ch.sock.closed
    assert ch.relay_sock.closed
    assert ch.listener.routes == {}
    assert loop.pending() == []  # the deadline timer is cancelled too
    assert ch.listener.protocol is not None
    assert ch.listener.protocol.closed.done()


async def test_an_engine_failure_is_logged_and_the_next_datagram_is_served(
    loop: MockLoop, ports: RelayPorts, caplog: pytest.LogCaptureFixture
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    engine = listener.engine
    original = engine.handle_client
    failed: list[bytes] = []

    def fails_once(data: bytes, client: tuple[str, int], now: float) -> list[Any]:
        if not failed:
            failed.append(data)
            raise RuntimeError("a bug in the engine")
        return original(data, client, now)

    engine.handle_client = fails_once  # type: ignore[method-assign]
    feed(listener, kit.binding_request())
    assert "engine failed on a client message" in caplog.text
    reply = client_at(listener, loop).exchange(kit.binding_request())
    assert reply.message_class == stun.Class.RESPONSE


async def test_a_listener_arms_one_timer_for_all_its_allocations(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    for port, lifetime_s in ((1, 3600), (2, 1200), (3, 1800)):
        client_at(listener, loop, ("192.0.2.10", port)).allocate(lifetime_s)
    [timer] = loop.pending()
    assert timer.when == listener.engine.next_deadline()
    loop.advance(1201)  # the shortest allocation expires; the timer moves on
    assert listener.allocation_count == 2
    [timer] = loop.pending()
    assert timer.when == listener.engine.next_deadline()
