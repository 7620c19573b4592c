"""TURN-DTLS on a fake datagram transport: cookies, handshakes run in memory, records in sessions.

The client is pyOpenSSL with memory BIOs (an independent DTLS stack); its datagrams are handed
to the listener's protocol and the listener's answers, recorded by the fake transport, are fed
back. Handshake deadlines, idle sessions and the per-source cap are checked on `MockLoop`'s clock.
"""

from __future__ import annotations

from typing import Any

import pytest
from aioice import stun
from OpenSSL import SSL

from stunner_common.config import TlsPair
from stunnerd.net.dtls import DtlsListener
from stunnerd.net.tuning import ServerTuning
from support import fake_listeners as kit
from support.fake_listeners import RelayPorts, TurnClient
from support.fake_net import FakeSocket, MockDatagramTransport, MockLoop

CLIENT = ("192.0.2.10", 40000)


class DtlsPeer:
    """A DTLS client talking to the listener through its protocol and the fake transport."""

    def __init__(self, listener: DtlsListener, addr: tuple[str, int] = CLIENT) -> None:
        ctx = SSL.Context(SSL.DTLS_METHOD)
        ctx.set_verify(SSL.VERIFY_NONE, lambda *_a: True)
        self.conn = SSL.Connection(ctx, None)
        self.conn.set_connect_state()
        self.listener = listener
        self.addr = addr
        self.seen = 0
        assert isinstance(listener.transport, MockDatagramTransport)
        self.transport: MockDatagramTransport = listener.transport

    def push(self) -> None:
        """Send what the client has queued to the listener."""
        assert self.listener.protocol is not None
        while True:
            try:
                datagram = self.conn.bio_read(65536)
            except SSL.WantReadError:
                return
            self.listener.protocol.datagram_received(datagram, self.addr)

    def pull(self) -> int:
        """Hand the listener's new datagrams for us to the client; how many there were."""
        new = [data for data, to in self.transport.sent[self.seen :] if to == self.addr]
        self.seen = len(self.transport.sent)
        for data in new:
            self.conn.bio_write(data)
        return len(new)

    def step(self) -> bool:
        """One flight each way; True once the client's handshake is done."""
        try:
            self.conn.do_handshake()
            done = True
        except SSL.WantReadError:
            done = False
        self.push()
        self.pull()
        return done

    def handshake(self) -> None:
        for _ in range(10):
            if self.step():
                return
        raise AssertionError("the DTLS handshake did not finish")

    def send(self, data: bytes) -> None:
        self.conn.send(data)
        self.push()

    def receive(self) -> list[bytes]:
        self.pull()
        records = []
        while True:
            try:
                records.append(self.conn.recv(65536))
            except SSL.WantReadError:
                return records

    def turn(self, loop: MockLoop) -> TurnClient:
        return TurnClient(self.send, self.receive, loop)


async def dtls_listener(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair, **kw: Any
) -> DtlsListener:
    listener: DtlsListener = kit.build(
        DtlsListener,
        "TURN-DTLS",
        loop,
        ports,
        tls=pair,
        tuning=ServerTuning(fastpath=False, udp_gso=False, client_idle_timeout_s=kit.IDLE_S),
        **kw,
    )
    listener.inherited_socket = FakeSocket(("127.0.0.1", 3478))  # type: ignore[assignment]
    await listener.start()
    return listener


async def test_a_hello_without_a_cookie_gets_a_cookie_and_leaves_no_state(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(loop, ports, pair)
    peer = DtlsPeer(listener)
    peer.step()  # ClientHello → HelloVerifyRequest (RFC 6347 §4.2.1)
    assert peer.seen == 1
    assert listener.sessions == {}
    assert listener.sources.counts == {}
    peer.handshake()
    assert set(listener.sessions) == {CLIENT}
    assert listener.connections == 1
    assert listener.sources.counts == {CLIENT[0]: 1}


async def test_a_request_inside_the_session_is_answered_inside_it(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(loop, ports, pair)
    peer = DtlsPeer(listener)
    peer.handshake()
    reply = peer.turn(loop).exchange(kit.binding_request())
    assert reply.attributes["XOR-MAPPED-ADDRESS"] == CLIENT
    assert all(data[0] != 0x00 for data, _to in peer.transport.sent)  # nothing in the clear


async def test_channel_data_records_take_the_fast_path_both_ways(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(loop, ports, pair)
    peer = DtlsPeer(listener)
    peer.handshake()
    client = peer.turn(loop)
    client.allocate()
    client.channel_bind()
    [relay_sock] = ports.opened
    peer.send(kit.channel_data(b"media", pad=False))
    assert relay_sock.sent == [(b"media", kit.PEER)]
    [(_t, relay)] = loop.endpoints[1:]
    relay.datagram_received(b"back", kit.PEER)
    assert peer.receive() == [kit.channel_data(b"back", pad=False)]


async def test_an_unfinished_handshake_is_dropped_at_its_deadline(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(
        loop, ports, pair, client_limits=kit.limits(handshake_timeout_s=5)
    )
    peer = DtlsPeer(listener)
    peer.step()  # the cookie
    peer.step()  # the hello with the cookie: a session, the server's flight
    assert set(listener.sessions) == {CLIENT}
    loop.advance(4.9)  # the client never answers; the server retransmits meanwhile
    assert set(listener.sessions) == {CLIENT}
    loop.advance(0.2)
    assert listener.sessions == {}
    assert listener.sources.counts == {}
    assert listener.connections == 0


async def test_a_session_that_sends_nothing_after_its_handshake_is_dropped(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(
        loop, ports, pair, client_limits=kit.limits(first_message_timeout_s=3)
    )
    peer = DtlsPeer(listener)
    peer.handshake()
    loop.advance(3.1)
    assert listener.sessions == {}
    assert listener.connections == 0


async def test_an_idle_session_without_an_allocation_ends_and_one_with_stays(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    patient = kit.limits(preauth_min_bytes_per_s=0.0, first_message_timeout_s=1000.0)
    listener = await dtls_listener(loop, ports, pair, client_limits=patient)
    idle, busy = DtlsPeer(listener, CLIENT), DtlsPeer(listener, ("192.0.2.11", 40001))
    idle.handshake()
    busy.handshake()
    busy.turn(loop).allocate(lifetime_s=3600)
    loop.advance(2 * kit.IDLE_S + 1)
    assert set(listener.sessions) == {busy.addr}


async def test_close_notify_from_the_client_ends_its_session_and_allocation(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(loop, ports, pair)
    peer = DtlsPeer(listener)
    peer.handshake()
    peer.turn(loop).allocate()
    assert listener.allocation_count == 1
    peer.conn.shutdown()
    peer.push()
    assert listener.sessions == {}
    assert listener.allocation_count == 0
    assert all(sock.closed for sock in ports.opened)
    assert listener.sources.counts == {}


async def test_the_per_source_cap_refuses_a_second_session(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(loop, ports, pair, client_limits=kit.limits(max_per_source=1))
    DtlsPeer(listener, ("192.0.2.10", 1)).handshake()
    refused = DtlsPeer(listener, ("192.0.2.10", 2))
    refused.step()
    refused.step()
    assert set(listener.sessions) == {("192.0.2.10", 1)}
    assert listener.refused_connections == 1


async def test_garbage_from_strangers_and_in_a_session_leaves_the_session_serving(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(loop, ports, pair)
    peer = DtlsPeer(listener)
    peer.handshake()
    assert listener.protocol is not None
    listener.protocol.datagram_received(b"\x16\xfe\xfd" + bytes(40), ("192.0.2.99", 9))
    listener.protocol.datagram_received(b"\x17\xfe\xfd" + bytes(40), ("192.0.2.99", 9))
    assert set(listener.sessions) == {CLIENT}
    peer.send(b"\x00\x01\x00\x00not stun")  # a record the engine cannot parse
    reply = peer.turn(loop).exchange(kit.binding_request())
    assert reply.message_class == stun.Class.RESPONSE


async def test_closing_the_listener_says_goodbye_to_every_session_once(
    loop: MockLoop, ports: RelayPorts, pair: TlsPair
) -> None:
    listener = await dtls_listener(loop, ports, pair)
    peer = DtlsPeer(listener)
    peer.handshake()
    transport = peer.transport
    await listener.close()
    await listener.close()
    assert transport.closed
    assert listener.sessions == {}
    peer.pull()
    with pytest.raises(SSL.ZeroReturnError):  # the close_notify the listener sent
        peer.conn.recv(65536)
