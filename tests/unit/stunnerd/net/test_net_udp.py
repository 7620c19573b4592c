"""TURN-UDP on a fake socket: the client → peer fast path, the engine's slow path and timers.

The listener serves an inherited `FakeSocket` (as a worker serves the supervisor's), so nothing
is bound; relays are `FakeSocket`s too and the clock is `MockLoop`'s.
"""

from __future__ import annotations

from aioice import stun

from stunnerd.net.udp import UdpListener
from support.fake_listeners import (
    PEER,
    RelayPorts,
    TurnClient,
    binding_request,
    build,
    channel_data,
)
from support.fake_net import FakeSocket, MockDatagramTransport, MockLoop

CLIENT = ("192.0.2.10", 40000)
OTHER = ("192.0.2.11", 40001)


async def udp_listener(loop: MockLoop, ports: RelayPorts) -> tuple[UdpListener, FakeSocket]:
    listener: UdpListener = build(UdpListener, "TURN-UDP", loop, ports)
    sock = FakeSocket(("127.0.0.1", 3478))
    listener.inherited_socket = sock  # type: ignore[assignment]
    await listener.start()
    return listener, sock


def transport_of(listener: UdpListener) -> MockDatagramTransport:
    assert isinstance(listener.transport, MockDatagramTransport)
    return listener.transport


def client_at(listener: UdpListener, loop: MockLoop, addr: tuple[str, int] = CLIENT) -> TurnClient:
    transport = transport_of(listener)
    seen = [len(transport.sent)]

    def send(data: bytes) -> None:
        assert listener.protocol is not None
        listener.protocol.datagram_received(data, addr)

    def receive() -> list[bytes]:
        new = [data for data, to in transport.sent[seen[0] :] if to == addr]
        seen[0] = len(transport.sent)
        return new

    return TurnClient(send, receive, loop)


async def test_a_binding_request_is_answered_on_the_listener_socket(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    assert listener.bound_port == 3478
    reply = client_at(listener, loop).exchange(binding_request())
    assert reply.attributes["XOR-MAPPED-ADDRESS"] == CLIENT
    assert listener.traffic == [1, 20, 1, len(transport_of(listener).sent[0][0])]


async def test_routed_channel_data_goes_to_the_peer_through_the_relay_socket(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate()
    client.channel_bind()
    [relay_sock] = ports.opened
    answered = len(transport_of(listener).sent)
    assert listener.protocol is not None
    listener.protocol.datagram_received(channel_data(b"media", pad=False), CLIENT)
    listener.protocol.datagram_received(channel_data(b"media", pad=True), CLIENT)  # padding ok
    assert relay_sock.sent == [(b"media", PEER), (b"media", PEER)]
    assert len(transport_of(listener).sent) == answered


async def test_channel_data_shorter_than_its_header_says_is_not_relayed(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate()
    client.channel_bind()
    [relay_sock] = ports.opened
    assert listener.protocol is not None
    listener.protocol.datagram_received(channel_data(b"media", pad=False)[:-1], CLIENT)
    assert relay_sock.sent == []


async def test_channel_data_from_another_client_on_the_same_channel_is_not_relayed(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate()
    client.channel_bind()
    [relay_sock] = ports.opened
    assert listener.protocol is not None
    listener.protocol.datagram_received(channel_data(b"spoofed", pad=False), OTHER)
    assert relay_sock.sent == []


async def test_an_oversized_datagram_is_counted_and_dropped(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    size = listener.limits.request.max_udp_datagram_bytes + 1
    request = binding_request()
    assert listener.protocol is not None
    listener.protocol.datagram_received(request + bytes(size - len(request)), CLIENT)
    assert transport_of(listener).sent == []
    assert listener.traffic[:2] == [1, size]


async def test_a_peer_datagram_reaches_the_client_as_channel_data_on_the_listener_socket(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate()
    client.channel_bind()
    [(_t, relay)] = loop.endpoints[1:]  # the first endpoint is the listener's own
    relay.datagram_received(b"abcde", PEER)
    assert sock.sent == [(channel_data(b"abcde", pad=False), CLIENT)]  # unpadded over UDP


async def test_a_peer_without_a_channel_reaches_the_client_in_a_data_indication(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate()
    reply = client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": PEER})
    assert reply.message_class == stun.Class.RESPONSE
    [(_t, relay)] = loop.endpoints[1:]
    relay.datagram_received(b"hello", PEER)
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
    assert listener.protocol is not None
    for junk in (b"\x00", b"\x00\x01\x00\x08" + bytes(16), b"\xff" * 40, bytes(20)):
        listener.protocol.datagram_received(junk, OTHER)
    assert [to for _d, to in transport_of(listener).sent].count(OTHER) == 0
    client.channel_bind()
    assert listener.allocation_count == 1


async def test_an_allocation_expires_on_the_listener_timer(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate(lifetime_s=600)
    client.channel_bind()
    [relay_sock] = ports.opened
    assert listener.connections == 1
    loop.advance(599)
    assert listener.allocation_count == 1
    loop.advance(2)
    assert listener.allocation_count == 0
    assert relay_sock.closed
    assert listener.routes == {}
    assert listener.relays == {}
    assert listener.connections == 0
    assert listener.connections_total == 1


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
    listener, sock = await udp_listener(loop, ports)
    client = client_at(listener, loop)
    client.allocate()
    client.channel_bind()
    await listener.close()
    await listener.close()
    assert sock.closed
    assert all(relay.closed for relay in ports.opened)
    assert listener.routes == {}
    assert loop.pending() == []  # the deadline timer is cancelled too
    assert listener.protocol is not None
    assert listener.protocol.closed.done()
