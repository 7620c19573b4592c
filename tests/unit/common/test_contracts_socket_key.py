"""The socket-key contract: one key per listener, the same on stunnerd's supervisor and workers."""

from __future__ import annotations

import pytest

from stunner_common.contracts.listener_address import NODE_ADDRESS_PLACEHOLDER
from stunner_common.contracts.socket_key import (
    SocketKey,
    listener_bind_host,
    listener_socket_key,
    socket_kind,
)


@pytest.mark.parametrize(
    "key",
    [SocketKey("udp", "0.0.0.0", 3478), SocketKey("tcp", "::", 443), SocketKey("udp", "", 0)],
)
def test_a_key_round_trips_through_its_message_fields(key: SocketKey) -> None:
    assert SocketKey.decode(key.encode()) == key
    assert SocketKey.decode({"op": "socket", **key.encode()}) == key


@pytest.mark.parametrize(
    ("protocol", "kind"),
    [("TURN-UDP", "udp"), ("TURN-DTLS", "udp"), ("TURN-TCP", "tcp"), ("TURN-TLS", "tcp")],
)
def test_datagram_protocols_take_udp_sockets_and_stream_protocols_tcp(
    protocol: str, kind: str
) -> None:
    assert socket_kind(protocol) == kind


@pytest.mark.parametrize(
    ("address", "bind_host", "node", "host"),
    [
        ("192.0.2.1", "0.0.0.0", "", "0.0.0.0"),
        ("2001:db8::1", "0.0.0.0", "", "::"),
        ("2001:db8::1", "::", "", "::"),
        ("2001:db8::1", "127.0.0.1", "", "::"),
        (NODE_ADDRESS_PLACEHOLDER, "0.0.0.0", "198.51.100.4", "0.0.0.0"),
        # The placeholder binds in the family of the node address it advertises.
        (NODE_ADDRESS_PLACEHOLDER, "0.0.0.0", "2001:db8::4", "::"),
        (NODE_ADDRESS_PLACEHOLDER, "0.0.0.0", "", "0.0.0.0"),
    ],
)
def test_a_listener_binds_in_the_family_of_what_it_advertises(
    address: str, bind_host: str, node: str, host: str
) -> None:
    key = listener_socket_key("TURN-UDP", address, 3478, bind_host, node)
    assert key == SocketKey("udp", host, 3478)


def test_an_ipv4_listener_keeps_the_bind_host() -> None:
    assert listener_bind_host("10.0.0.5", "10.0.0.6") == "10.0.0.5"
