"""A listener's address: what the operator renders, the CDS fills in and stunnerd advertises.

The operator renders every listener's ``address`` as ``$STUNNER_ADDR`` (stunnerd expands it from
its environment: the pod IP), or, with relay address discovery, as the node-address placeholder.
The CDS fills the placeholder, for a client that names its node, with that Node's external
address (else ``$STUNNER_ADDR``) on the decoded config, before it encodes a frame. stunnerd
advertises the listener's address as its relay address; a placeholder the CDS left is the node
address stunnerd was given, and a wildcard is loopback. The listener's socket binds in the
family of what it advertises (``stunner_common.contracts.socket_key``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

NODE_ADDRESS_PLACEHOLDER: Final = "__node_address_placeholder"
"""A listener address the CDS replaces with the stunnerd pod's Node's external address."""

POD_ADDRESS_ENV: Final = "STUNNER_ADDR"
"""The environment variable that carries the stunnerd pod's IP (the Deployment sets it)."""

POD_ADDRESS: Final = "$" + POD_ADDRESS_ENV
"""The listener address the operator renders: stunnerd expands it to the pod IP."""

WILDCARD_ADDRESSES: Final = frozenset({"0.0.0.0", "::", ""})
"""Addresses that bind everywhere and cannot be advertised."""

WILDCARD_RELAY_ADDRESS: Final = "127.0.0.1"
"""What a listener on a wildcard address advertises: only local clients can use it."""


class NodeAddressMissingError(ValueError):
    """A listener asks for the node's address (the placeholder) and stunnerd was given none."""


def is_node_placeholder(address: str) -> bool:
    return address == NODE_ADDRESS_PLACEHOLDER


def advertised_address(listener_name: str, address: str, node_address: str = "") -> str:
    """The IP a listener advertises in XOR-RELAYED-ADDRESS (upstream §5.2).

    The placeholder is `node_address` (the CDS did not fill it in); without one the listener
    cannot run: `NodeAddressMissingError`. A wildcard is `WILDCARD_RELAY_ADDRESS`.
    """
    if address == NODE_ADDRESS_PLACEHOLDER:
        if not node_address:
            raise NodeAddressMissingError(
                f"listener {listener_name}: address {NODE_ADDRESS_PLACEHOLDER} (relay address "
                f"discovery) needs the node's address: set STUNNERD_NODE_ADDRESS or "
                f"{POD_ADDRESS_ENV}"
            )
        return node_address
    if address in WILDCARD_ADDRESSES:
        return WILDCARD_RELAY_ADDRESS
    return address


def family_address(address: str, node_address: str = "") -> str:
    """The address whose family a listener's socket takes: the node's address for the
    placeholder (the relay address it advertises), else the listener's own address."""
    return node_address if address == NODE_ADDRESS_PLACEHOLDER else address


def node_fill(node_address: str | None) -> str:
    """What the CDS puts in place of the placeholder: the Node's address, else ``$STUNNER_ADDR``."""
    return node_address or POD_ADDRESS


def has_node_placeholder(config: Mapping[str, Any]) -> bool:
    """Whether a decoded stunnerd config has a listener at the node-address placeholder."""
    listeners = config.get("listeners")
    return isinstance(listeners, list) and any(
        isinstance(ls, Mapping) and ls.get("address") == NODE_ADDRESS_PLACEHOLDER
        for ls in listeners
    )


def fill_node_address(config: Mapping[str, Any], value: str) -> Mapping[str, Any]:
    """A decoded stunnerd config with every placeholder listener address set to `value`.

    `config` itself when it has none (nothing is copied); otherwise a shallow copy that shares
    every part but the listeners it changes.
    """
    if not has_node_placeholder(config):
        return config
    listeners = [
        {**ls, "address": value}
        if isinstance(ls, Mapping) and ls.get("address") == NODE_ADDRESS_PLACEHOLDER
        else ls
        for ls in config["listeners"]
    ]
    return {**config, "listeners": listeners}
