"""RFC 6062 on fake transports: a peer connection stays silent until a data connection is bound
to it, then raw bytes flow both ways, each side pausing the other, and closing one closes both."""

from __future__ import annotations

from stunnerd.net.stream import StreamClientProtocol
from stunnerd.net.tcp_relay import PeerLink
from stunnerd.turn import effects as fx
from support import fake_listeners as kit
from support.fake_listeners import CLIENT, OTHER, RelayPorts, connect, tcp_listener
from support.fake_net import MockLoop, MockTransport

CONNECTION_ID = 7


def spliced(
    loop: MockLoop, ports: RelayPorts
) -> tuple[PeerLink, MockTransport, MockTransport, StreamClientProtocol]:
    """A peer connection of `CLIENT`'s allocation (as a Connect's task registers it) and the data
    connection from `OTHER` bound to it."""
    listener = tcp_listener(loop, ports)
    relays = listener.tcp_relays
    link = PeerLink(relays, CLIENT)
    link.connection_id = CONNECTION_ID
    peer = MockTransport(loop, kit.PEER).attach(link)
    assert not peer.reading  # no peer data before ConnectionBind (RFC 6062 §5.3)
    relays.links[CONNECTION_ID] = link
    data, data_transport = connect(listener, loop, OTHER)
    relays.bind(fx.BindPeerConnection(OTHER, CONNECTION_ID))
    assert data.peer_link is link
    assert peer.reading
    return link, peer, data_transport, data


def test_bytes_flow_unframed_both_ways_once_bound(loop: MockLoop, ports: RelayPorts) -> None:
    link, peer, data_transport, data = spliced(loop, ports)
    data.data_received(b"\x00\x01 not a STUN frame")
    assert peer.written == [b"\x00\x01 not a STUN frame"]
    link.data_received(b"from the peer")
    assert data_transport.written == [b"from the peer"]


def test_each_side_pauses_the_other_when_its_buffer_fills(
    loop: MockLoop, ports: RelayPorts
) -> None:
    link, peer, data_transport, data = spliced(loop, ports)
    data.pause_writing()
    assert not peer.reading
    data.resume_writing()
    assert peer.reading
    link.pause_writing()
    assert not data_transport.reading
    link.resume_writing()
    assert data_transport.reading


def test_a_bound_data_connection_is_spared_by_the_idle_and_rate_guards(
    loop: MockLoop, ports: RelayPorts
) -> None:
    _link, _peer, data_transport, _data = spliced(loop, ports)
    loop.advance(10 * kit.IDLE_S)
    assert not data_transport.closed


def test_losing_the_peer_closes_the_data_connection_and_forgets_the_link(
    loop: MockLoop, ports: RelayPorts
) -> None:
    link, peer, data_transport, _data = spliced(loop, ports)
    peer.close()
    loop.run_ready()
    assert data_transport.closed
    assert CONNECTION_ID not in link.relays.links


def test_losing_the_data_connection_closes_the_peer(loop: MockLoop, ports: RelayPorts) -> None:
    _link, peer, data_transport, _data = spliced(loop, ports)
    data_transport.close()
    loop.run_ready()
    assert peer.closed


def test_binding_to_a_connection_that_is_gone_closes_the_data_connection(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener = tcp_listener(loop, ports)
    _data, data_transport = connect(listener, loop, OTHER)
    listener.tcp_relays.bind(fx.BindPeerConnection(OTHER, 99))
    assert data_transport.closed


def test_a_peer_connection_to_no_allocation_is_refused(loop: MockLoop, ports: RelayPorts) -> None:
    listener = tcp_listener(loop, ports)
    peer = MockTransport(loop, kit.PEER).attach(PeerLink(listener.tcp_relays, CLIENT))
    assert peer.aborted
    assert listener.tcp_relays.links == {}
