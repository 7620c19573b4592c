"""TURN-TCP connections on fake transports: de-framing, the fast path, and the pre-allocation guard.

A `StreamClientProtocol` of a real `StreamListener` is fed bytes as a socket would deliver them
(one byte at a time, several frames in one read); the time-based guards fire as `MockLoop` moves.
"""

from __future__ import annotations

import pytest
from aioice import stun

from stunnerd.net.stream import StreamClientProtocol, StreamListener
from support import fake_listeners as kit
from support.fake_listeners import CLIENT, OTHER, RelayPorts, TurnClient, connect, tcp_listener
from support.fake_net import MockLoop, MockTransport


def client_on(proto: StreamClientProtocol, transport: MockTransport, loop: MockLoop) -> TurnClient:
    seen = [len(transport.written)]

    def receive() -> list[bytes]:
        new = transport.written[seen[0] :]
        seen[0] = len(transport.written)
        return new

    return TurnClient(proto.data_received, receive, loop)


def bound_channel(
    loop: MockLoop, ports: RelayPorts
) -> tuple[StreamListener, StreamClientProtocol, MockTransport]:
    """A connection with an allocation and a channel to `kit.PEER`."""
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    client = client_on(proto, transport, loop)
    client.allocate()
    client.channel_bind()
    return listener, proto, transport


def answers(transport: MockTransport) -> list[stun.Message]:
    return [stun.parse_message(data) for data in transport.written]


# ---------------------------------------------------------------------- framing


def test_a_request_fed_one_byte_at_a_time_is_answered_once_complete(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    request = kit.binding_request()
    for i, byte in enumerate(request):
        assert transport.written == [], f"answered after {i} of {len(request)} bytes"
        proto.data_received(bytes([byte]))
    [reply] = answers(transport)
    assert reply.message_method == stun.Method.BINDING
    assert reply.message_class == stun.Class.RESPONSE
    assert reply.attributes["XOR-MAPPED-ADDRESS"] == CLIENT


def test_frames_that_share_a_read_are_each_answered(loop: MockLoop, ports: RelayPorts) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    first, second = kit.binding_request(), kit.binding_request()
    together = first + second
    proto.data_received(together[:30])  # the first frame and a piece of the second
    assert len(transport.written) == 1
    proto.data_received(together[30:])
    replies = answers(transport)
    assert [r.transaction_id for r in replies] == [
        stun.parse_message(first).transaction_id,
        stun.parse_message(second).transaction_id,
    ]
    assert proto.frames == 2


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 5, 9, 11])
def test_routed_channel_data_crosses_read_boundaries_and_loses_its_padding(
    loop: MockLoop, ports: RelayPorts, cut: int
) -> None:
    _listener, proto, transport = bound_channel(loop, ports)
    [relay_sock] = ports.opened
    answered = len(transport.written)
    frames = kit.channel_data(b"hello", pad=True) + kit.channel_data(b"media!!", pad=True)
    assert len(frames) == 12 + 12  # each payload padded to 4 bytes (RFC 8656 §12.5)
    proto.data_received(frames[:cut])
    proto.data_received(frames[cut:])
    assert relay_sock.sent == [(b"hello", kit.PEER), (b"media!!", kit.PEER)]
    assert len(transport.written) == answered  # nothing went to the engine


def test_channel_data_without_a_route_goes_to_the_engine_and_is_dropped(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    proto.data_received(kit.channel_data(b"to nobody", pad=True) + kit.binding_request())
    assert len(answers(transport)) == 1  # the Binding behind it still gets through
    assert not transport.closed


def test_a_peer_datagram_reaches_the_client_as_padded_channel_data(
    loop: MockLoop, ports: RelayPorts
) -> None:
    _listener, _proto, transport = bound_channel(loop, ports)
    [(_t, relay)] = loop.endpoints
    relay.datagram_received(b"abcde", kit.PEER)
    assert transport.written[-1] == kit.channel_data(b"abcde", pad=True)


# ---------------------------------------------------------------------- bad input


def test_a_bad_frame_closes_only_its_own_connection(loop: MockLoop, ports: RelayPorts) -> None:
    listener = tcp_listener(loop, ports)
    bad, bad_transport = connect(listener, loop, CLIENT)
    good, good_transport = connect(listener, loop, OTHER)
    bad.data_received(b"\xff\xff\x00\x04junk")  # neither STUN (0b00) nor ChannelData (0b01)
    assert bad_transport.closed
    good.data_received(kit.binding_request())
    assert len(answers(good_transport)) == 1
    assert not good_transport.closed
    loop.run_ready()
    assert set(listener.clients) == {OTHER}
    assert listener.connections == 1


def test_an_oversized_stun_header_closes_before_the_body_is_buffered(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    cap = listener.limits.request.max_message_bytes
    header = bytearray(kit.binding_request()[:20])
    header[2:4] = (cap - 20 + 4).to_bytes(2, "big")  # announces a message 4 bytes over the cap
    proto.data_received(bytes(header))
    assert transport.closed
    assert proto.buf == bytearray()


def test_a_malformed_stun_message_is_dropped_and_the_connection_lives_on(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    garbage = bytearray(kit.binding_request())
    garbage[4:8] = b"\x00\x00\x00\x00"  # no magic cookie: not a STUN message the engine takes
    proto.data_received(bytes(garbage) + kit.binding_request())
    assert len(answers(transport)) == 1
    assert not transport.closed


# ---------------------------------------------------------------------- guards and lifetime


def test_a_connection_that_never_sends_is_closed_at_the_first_message_deadline(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports, kit.limits(first_message_timeout_s=5.0))
    _proto, transport = connect(listener, loop)
    loop.advance(4.9)
    assert not transport.closed
    loop.advance(0.2)
    assert transport.closed
    assert listener.connections == 0
    assert listener.sources.counts == {}


def test_a_trickle_below_the_minimum_rate_is_closed_before_it_allocates(
    loop: MockLoop, ports: RelayPorts
) -> None:
    connection = {"first_message_timeout_s": 1.0, "preauth_window_s": 10.0}
    listener = tcp_listener(loop, ports, kit.limits(preauth_min_bytes_per_s=8.0, **connection))
    proto, transport = connect(listener, loop)
    proto.data_received(kit.binding_request() * 4)  # 80 bytes: 8 B/s over a 10 s window
    loop.advance(1.0)
    assert not transport.closed
    proto.data_received(b"\x00" * 20)  # 20 bytes in the next 10 s: under 8 B/s
    loop.advance(9.9)
    assert not transport.closed
    loop.advance(0.1)
    assert transport.closed


def test_an_idle_connection_without_an_allocation_is_closed(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    proto.data_received(kit.binding_request())
    loop.advance(kit.IDLE_S)  # active since the last check: spared once
    assert not transport.closed
    loop.advance(kit.IDLE_S)
    assert transport.closed


def test_a_connection_holding_an_allocation_is_never_closed_for_idling(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    client_on(proto, transport, loop).allocate(lifetime_s=3600)
    loop.advance(10 * kit.IDLE_S)
    assert not transport.closed
    assert listener.allocation_count == 1


def test_the_per_source_cap_refuses_and_a_closed_connection_frees_its_slot(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports, kit.limits(max_per_source=1))
    _first, first_transport = connect(listener, loop, ("192.0.2.10", 1))
    _second, second_transport = connect(listener, loop, ("192.0.2.10", 2))
    assert second_transport.aborted
    assert listener.refused_connections == 1
    loop.run_ready()
    assert listener.sources.counts == {"192.0.2.10": 1}  # the refused one took nothing
    first_transport.close()
    loop.run_ready()
    assert listener.sources.counts == {}
    _third, third_transport = connect(listener, loop, ("192.0.2.10", 3))
    assert not third_transport.closed


def test_losing_the_connection_deletes_its_allocation_and_relay(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, proto, transport = bound_channel(loop, ports)
    [(relay_transport, _relay)] = loop.endpoints
    transport.close()
    loop.run_ready()
    assert listener.allocation_count == 0
    assert relay_transport.closed
    assert listener.routes == {}
    # no idle or guard timer left behind; only the engine's own next deadline stays armed
    assert proto.idle_handle is None
    assert proto.guard_handle is None
    assert [h.when for h in loop.pending()] == [listener.engine.next_deadline()]


def test_writes_to_a_client_whose_buffer_is_full_are_dropped(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    proto.pause_writing()
    proto.data_received(kit.binding_request())
    assert transport.written == []
    proto.resume_writing()
    proto.data_received(kit.binding_request())
    assert len(transport.written) == 1


async def test_closing_the_listener_aborts_clients_and_is_idempotent(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    proto, transport = connect(listener, loop)
    client_on(proto, transport, loop).allocate()
    await listener.close()
    await listener.close()
    assert transport.aborted
    assert transport.close_calls == 1
    assert listener.allocation_count == 0
    assert listener.clients == {}
    assert all(sock.closed for sock in ports.opened)
    loop.run_ready()  # the aborted connection reports its loss after the listener closed
    assert listener.sources.counts == {}
