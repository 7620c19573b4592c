"""stunnerd's supervisor binds, and its workers' listeners look up, the same socket key."""

from __future__ import annotations

import pytest

from stunner_common.config import ListenerConfig, ListenerProtocol
from stunner_common.contracts.listener_address import NODE_ADDRESS_PLACEHOLDER
from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.workers.sockets import listener_key


@pytest.mark.parametrize(
    ("address", "node_address"),
    [
        ("192.0.2.1", ""),
        ("2001:db8::1", ""),
        (NODE_ADDRESS_PLACEHOLDER, "198.51.100.4"),
        (NODE_ADDRESS_PLACEHOLDER, "2001:db8::4"),
    ],
)
@pytest.mark.parametrize("protocol", ["TURN-UDP", "TURN-TCP"])
def test_the_supervisor_and_a_worker_derive_the_same_key(
    address: str, node_address: str, protocol: ListenerProtocol
) -> None:
    listener = ListenerConfig(name="l", protocol=protocol, address=address, port=3478)
    server = TurnServer(ServerOptions(bind_host="0.0.0.0", node_address=node_address))
    worker_key = server._socket_key(listener)
    assert worker_key == listener_key(listener, "0.0.0.0", node_address)
    assert server._spec(listener).bind_host == worker_key.host


def test_a_node_address_listener_with_an_ipv6_relay_binds_the_ipv6_wildcard() -> None:
    listener = ListenerConfig(name="l", address=NODE_ADDRESS_PLACEHOLDER, port=3478)
    assert listener_key(listener, "0.0.0.0", "2001:db8::4").host == "::"
