"""TURN-TLS admission without sockets: a connection takes its source's slot when it is accepted,
before its handshake, and keeps that one slot (no second count when the handshake completes)."""

from __future__ import annotations

import ssl

import pytest

from stunner_common.config import TlsPair, load_tls_pair, self_signed_pair
from stunnerd.net.stream import StreamClientProtocol, StreamListener
from support import fake_listeners as kit
from support.fake_listeners import RelayPorts
from support.fake_net import MockLoop, MockTransport

SOURCE = "192.0.2.10"


def tls_listener(loop: MockLoop, ports: RelayPorts, pair: TlsPair, cap: int) -> StreamListener:
    listener: StreamListener = kit.build(
        StreamListener,
        "TURN-TLS",
        loop,
        ports,
        tls=pair,
        client_limits=kit.limits(max_per_source=cap),
    )
    assert listener.tls is not None
    return listener


def handshaken(listener: StreamListener, loop: MockLoop, port: int) -> MockTransport:
    """A connection the acceptor admitted, once its handshake is done (`connection_made`)."""
    assert listener.tls is not None
    proto = listener.tls.new_client()
    assert isinstance(proto, StreamClientProtocol)
    return MockTransport(loop, (SOURCE, port)).attach(proto)


def test_an_accepted_connection_holds_one_slot_through_its_handshake(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = tls_listener(loop, ports, pair, cap=2)
    assert listener.admit(SOURCE)  # counted at TCP accept
    transport = handshaken(listener, loop, 1)
    assert not transport.closed
    assert listener.sources.counts == {SOURCE: 1}
    assert listener.connections == 1
    transport.close()
    loop.run_ready()
    assert listener.sources.counts == {}
    assert listener.connections == 0


def test_connections_over_the_cap_are_refused_at_accept(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = tls_listener(loop, ports, pair, cap=1)
    assert listener.admit(SOURCE)
    assert not listener.admit(SOURCE)
    assert listener.refused_connections == 1
    assert listener.admit("192.0.2.11")  # the cap is per source
    assert listener.sources.counts == {SOURCE: 1, "192.0.2.11": 1}


def test_a_rotated_certificate_goes_into_the_context_the_acceptor_uses(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = tls_listener(loop, ports, pair, cap=1)
    assert listener.tls is not None
    context = listener.tls.context
    assert listener.rotate_certificate(load_tls_pair(*self_signed_pair("127.0.0.2")))
    assert listener.ssl_context is context
    assert listener.tls.context is context


def test_a_certificate_that_does_not_load_leaves_the_live_one_alone(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = tls_listener(loop, ports, pair, cap=1)
    with pytest.raises(ssl.SSLError):
        listener.rotate_certificate(TlsPair(pair.cert_pem, b"-----BEGIN PRIVATE KEY-----\n"))
    assert listener.tls is not None
    assert listener.tls.context is listener.ssl_context
