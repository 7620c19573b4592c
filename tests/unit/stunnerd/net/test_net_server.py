"""The server's glue that needs no socket: which relay address a listener advertises, and a bad
certificate refused with the listener's name before anything is bound."""

from __future__ import annotations

import logging
from typing import Literal

import pytest

from stunner_common.config import ListenerConfig
from stunner_common.contracts.listener_address import NODE_ADDRESS_PLACEHOLDER
from stunnerd.net.server import ListenerError, TurnServer, other_relay_address, relay_address


@pytest.mark.parametrize(
    ("address", "node", "advertised"),
    [
        ("192.0.2.1", "", "192.0.2.1"),
        ("2001:db8::1", "", "2001:db8::1"),
        (NODE_ADDRESS_PLACEHOLDER, "198.51.100.4", "198.51.100.4"),
    ],
)
def test_a_listener_advertises_its_own_address_or_the_nodes(
    address: str, node: str, advertised: str
) -> None:
    listener = ListenerConfig(name="l", address=address)
    assert relay_address(listener, node) == advertised


def test_a_wildcard_address_advertises_loopback_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="stunnerd.net.server"):
        assert relay_address(ListenerConfig(name="l", address="0.0.0.0")) == "127.0.0.1"
    assert "only local clients" in caplog.text


def test_the_node_address_placeholder_without_a_node_address_is_refused() -> None:
    with pytest.raises(ValueError, match="STUNNERD_NODE_ADDRESS"):
        relay_address(ListenerConfig(name="l", address=NODE_ADDRESS_PLACEHOLDER))


@pytest.mark.parametrize(
    ("primary", "extra", "other"),
    [
        ("192.0.2.1", ("192.0.2.2", "2001:db8::2", "2001:db8::3"), "2001:db8::2"),
        ("2001:db8::1", ("2001:db8::2", "192.0.2.2"), "192.0.2.2"),
        ("192.0.2.1", ("192.0.2.2",), ""),
    ],
)
def test_the_other_relay_address_is_the_first_of_the_other_family(
    primary: str, extra: tuple[str, ...], other: str
) -> None:
    assert other_relay_address(primary, extra) == other


@pytest.mark.parametrize("protocol", ["TURN-TLS", "TURN-DTLS"])
def test_a_certificate_that_does_not_load_is_refused_with_the_listeners_name(
    protocol: Literal["TURN-TLS", "TURN-DTLS"],
) -> None:
    listener = ListenerConfig.model_construct(
        name="secure", protocol=protocol, address="192.0.2.1", port=443, cert="bm9wZQ==", key=""
    )
    with pytest.raises(ListenerError, match="listener secure"):
        TurnServer().check_listener(listener)
