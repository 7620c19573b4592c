"""The listener-address contract: the operator's placeholder, the CDS's fill, stunnerd's address."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stunner_common.cds import encode_snapshot, encode_v1_config
from stunner_common.config import parse_config
from stunner_common.contracts.listener_address import (
    NODE_ADDRESS_PLACEHOLDER,
    POD_ADDRESS,
    WILDCARD_RELAY_ADDRESS,
    NodeAddressMissingError,
    advertised_address,
    family_address,
    fill_node_address,
    has_node_placeholder,
    node_fill,
)


def config(*addresses: str) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {"name": "ns/gw"},
        "auth": {"type": "static", "realm": "r", "credentials": {"username": "u", "password": "p"}},
        "listeners": [
            {"name": f"ns/gw/l{i}", "protocol": "TURN-UDP", "address": a, "port": 3478 + i}
            for i, a in enumerate(addresses)
        ],
    }


def text_replacement(frame: str, address: str | None) -> str:
    """What the CDS did before the contract: replace the quoted placeholder in the frame."""
    value = json.dumps(address) if address else json.dumps(POD_ADDRESS)
    return frame.replace(json.dumps(NODE_ADDRESS_PLACEHOLDER), value)


@pytest.mark.parametrize("address", ["198.51.100.7", "2001:db8::7", None])
@pytest.mark.parametrize(
    "addresses",
    [
        (NODE_ADDRESS_PLACEHOLDER,),
        (NODE_ADDRESS_PLACEHOLDER, POD_ADDRESS, NODE_ADDRESS_PLACEHOLDER),
        (POD_ADDRESS,),
    ],
)
def test_filling_the_decoded_config_encodes_the_frames_text_replacement_did(
    address: str | None, addresses: tuple[str, ...]
) -> None:
    rendered = parse_config(config(*addresses)).to_dict()
    stored = json.loads(json.dumps(rendered))  # the operator's encode, the CDS's decode
    filled = fill_node_address(stored, node_fill(address))
    assert encode_v1_config(filled) == text_replacement(encode_v1_config(stored), address)
    assert encode_snapshot("ns/gw", 3, filled, "e") == text_replacement(
        encode_snapshot("ns/gw", 3, stored, "e"), address
    )


def test_a_config_without_the_placeholder_is_not_copied() -> None:
    stored = config(POD_ADDRESS)
    assert not has_node_placeholder(stored)
    assert fill_node_address(stored, "198.51.100.7") is stored


def test_filling_leaves_the_decoded_config_as_it_was() -> None:
    stored = config(NODE_ADDRESS_PLACEHOLDER)
    filled = fill_node_address(stored, "198.51.100.7")
    assert filled["listeners"][0]["address"] == "198.51.100.7"
    assert stored["listeners"][0]["address"] == NODE_ADDRESS_PLACEHOLDER


@pytest.mark.parametrize(
    ("address", "node", "advertised", "family"),
    [
        ("192.0.2.1", "", "192.0.2.1", "192.0.2.1"),
        ("0.0.0.0", "", WILDCARD_RELAY_ADDRESS, "0.0.0.0"),
        ("::", "", WILDCARD_RELAY_ADDRESS, "::"),
        (NODE_ADDRESS_PLACEHOLDER, "198.51.100.4", "198.51.100.4", "198.51.100.4"),
        (NODE_ADDRESS_PLACEHOLDER, "2001:db8::4", "2001:db8::4", "2001:db8::4"),
    ],
)
def test_stunnerd_advertises_and_binds_in_the_family_of_the_listener_address(
    address: str, node: str, advertised: str, family: str
) -> None:
    assert advertised_address("l", address, node) == advertised
    assert family_address(address, node) == family


def test_a_placeholder_left_without_a_node_address_names_the_settings_to_set() -> None:
    with pytest.raises(NodeAddressMissingError, match="STUNNERD_NODE_ADDRESS or STUNNER_ADDR"):
        advertised_address("l", NODE_ADDRESS_PLACEHOLDER)
