"""STUN Binding answered by the C fast path: the engine's own bytes, read back by aioice's decoder
(which checks FINGERPRINT), and everything the engine would not answer with plain success left
to the engine, untouched. Real sockets on the loopback addresses, ports chosen by the kernel."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from aioice import stun

from stunner_common.stun import Class, encode
from stunnerd import fastpath
from support.c_relay import fast_relay, poll, udp_socket, watched_listener

pytestmark = pytest.mark.skipif(not fastpath.available(), reason="stunnerd._fastpath not built")

SOFTWARE = "stunnerd/binding-test"
MAX_STUN = 1024
BINDING = 0x0001


@pytest.fixture
def relay() -> Iterator[Any]:
    with fast_relay() as r:
        yield r


def _listener(
    relay: Any, host: str = "127.0.0.1", software: str | None = SOFTWARE
) -> socket.socket:
    sock = watched_listener(relay, host, MAX_STUN)
    if software is not None:
        relay.answer_binding(sock.fileno(), software.encode())
    return sock


def _request(*attrs: tuple[int, bytes]) -> bytes:
    body = b"".join(struct.pack("!HH", t, len(v)) + v + bytes(-len(v) % 4) for t, v in attrs)
    return struct.pack("!HHI", BINDING, len(body), stun.COOKIE) + os.urandom(12) + body


def _exchange(relay: Any, listener: socket.socket, client: socket.socket, request: bytes) -> bytes:
    client.sendto(request, listener.getsockname()[:2])
    assert poll(relay) == []
    answer, source = client.recvfrom(2048)
    assert source[:2] == listener.getsockname()[:2]
    return answer


def test_a_plain_binding_gets_the_engine_s_answer_from_c(relay: Any) -> None:
    listener, client = _listener(relay), udp_socket("127.0.0.1")
    request = _request()
    answer = _exchange(relay, listener, client, request)
    message = stun.parse_message(answer)  # raises on a wrong FINGERPRINT
    assert message.message_method == stun.Method.BINDING
    assert message.message_class == stun.Class.RESPONSE
    assert message.transaction_id == request[8:20]
    assert message.attributes["XOR-MAPPED-ADDRESS"] == client.getsockname()
    assert message.attributes["SOFTWARE"] == SOFTWARE
    assert "FINGERPRINT" in message.attributes
    mapped = {"XOR-MAPPED-ADDRESS": client.getsockname()}
    assert answer == encode(BINDING, Class.RESPONSE, request[8:20], mapped, software=SOFTWARE)
    assert relay.stats()["answered"] == 1


def test_an_ipv6_client_gets_its_address_xored_with_the_transaction_id(relay: Any) -> None:
    listener, client = _listener(relay, "::1"), udp_socket("::1")
    request = _request()
    answer = _exchange(relay, listener, client, request)
    assert stun.parse_message(answer).attributes["XOR-MAPPED-ADDRESS"] == (
        "::1",
        client.getsockname()[1],
    )
    mapped = {"XOR-MAPPED-ADDRESS": ("::1", client.getsockname()[1])}
    assert answer == encode(BINDING, Class.RESPONSE, request[8:20], mapped, software=SOFTWARE)


def test_an_ipv4_client_of_a_dual_stack_listener_is_answered_with_its_ipv4_address(
    relay: Any,
) -> None:
    listener = _listener(relay, "::")
    client = udp_socket("127.0.0.1")
    request = _request()
    client.sendto(request, ("127.0.0.1", listener.getsockname()[1]))
    assert poll(relay) == []
    answer = client.recv(2048)
    mapped = {"XOR-MAPPED-ADDRESS": client.getsockname()}
    assert answer == encode(BINDING, Class.RESPONSE, request[8:20], mapped, software=SOFTWARE)


def test_optional_attributes_are_read_past_and_no_software_means_none(relay: Any) -> None:
    listener, client = _listener(relay, software=""), udp_socket("127.0.0.1")
    message = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
    message.attributes["SOFTWARE"] = "a client"
    message.add_fingerprint()
    request = bytes(message)
    answer = _exchange(relay, listener, client, request)
    mapped = {"XOR-MAPPED-ADDRESS": client.getsockname()}
    assert answer == encode(BINDING, Class.RESPONSE, request[8:20], mapped)
    assert "SOFTWARE" not in stun.parse_message(answer).attributes


@pytest.mark.parametrize(
    "request_bytes",
    [
        _request((0x7777, b"abcd")),  # unknown comprehension-required: the engine's 420
        _request((0x0008, bytes(20))),  # MESSAGE-INTEGRITY
        _request(*[(0x8022, b"x")] * 9),  # more attributes than C reads
        _request((0x8022, b"abcdefgh"))[:-4],  # attribute overruns the message: the engine's 400
        struct.pack("!HHI", 0x0011, 0, stun.COOKIE) + bytes(12),  # a Binding indication
        struct.pack("!HHI", 0x0003, 0, stun.COOKIE) + bytes(12),  # an Allocate
    ],
    ids=["unknown-required", "integrity", "many-attributes", "overrun", "indication", "allocate"],
)
def test_what_c_does_not_answer_reaches_the_engine_untouched(
    relay: Any, request_bytes: bytes
) -> None:
    listener, client = _listener(relay), udp_socket("127.0.0.1")
    fixed = bytearray(request_bytes)
    fixed[2:4] = struct.pack("!H", len(fixed) - 20)
    client.sendto(bytes(fixed), listener.getsockname())
    assert poll(relay) == [(listener.fileno(), bytes(fixed), client.getsockname())]
    assert relay.stats()["answered"] == 0


def test_a_listener_not_asked_to_answer_leaves_binding_to_the_engine(relay: Any) -> None:
    listener, client = _listener(relay, software=None), udp_socket("127.0.0.1")
    request = _request()
    client.sendto(request, listener.getsockname())
    assert poll(relay) == [(listener.fileno(), request, client.getsockname())]


def test_watching_the_socket_number_again_forgets_the_answering(relay: Any) -> None:
    from stunnerd import _fastpath

    listener, client = _listener(relay), udp_socket("127.0.0.1")
    relay.unwatch(listener.fileno())
    relay.watch(listener.fileno(), _fastpath.LISTENER, 0, MAX_STUN)
    request = _request()
    client.sendto(request, listener.getsockname())
    assert poll(relay) == [(listener.fileno(), request, client.getsockname())]


def test_the_size_limit_still_drops_an_oversized_binding_unanswered(relay: Any) -> None:
    listener, client = _listener(relay), udp_socket("127.0.0.1")
    client.sendto(_request((0x8022, b"x" * MAX_STUN)), listener.getsockname())
    assert poll(relay) == []
    stats = relay.stats()
    assert (stats["dropped"], stats["answered"]) == (1, 0)
    client.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client.recv(2048)


def test_the_answer_counts_as_sent_on_the_listener(relay: Any) -> None:
    listener, client = _listener(relay), udp_socket("127.0.0.1")
    request = _request()
    answer = _exchange(relay, listener, client, request)
    (slot, rx_pkts, rx_bytes, tx_pkts, tx_bytes), *_ = relay.take_counters()
    assert (slot, rx_pkts, rx_bytes, tx_pkts, tx_bytes) == (0, 1, len(request), 1, len(answer))


def test_a_long_software_is_refused() -> None:
    from stunnerd import _fastpath

    r: Any = _fastpath.FastRelay()
    sock = udp_socket("127.0.0.1")
    r.watch(sock.fileno(), _fastpath.LISTENER, 0, MAX_STUN)
    with pytest.raises(ValueError, match="SOFTWARE too long"):
        r.answer_binding(sock.fileno(), b"x" * 764)
    with pytest.raises(ValueError, match="not a watched listener"):
        r.answer_binding(sock.fileno() + 100, b"")
    r.close()
