"""Relay address discovery: the operator renders the node-address placeholder for a Gateway with
`stunner.l7mp.io/enable-relay-address-discovery`, and stunnerd relays from the node's address.

Here no CDS fills the placeholder in, so stunnerd takes the node's address from its settings
(`STUNNERD_NODE_ADDRESS`, else `STUNNER_ADDR`) and puts it in XOR-RELAYED-ADDRESS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aioice.turn import create_turn_endpoint

from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, UDP_GATEWAY, objects_from_yaml
from support.ports import free_port, free_udp_tcp_port
from support.stunnerd_process import PASSWORD, USER, ManagedStunnerd, TurnReceiver, base_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NODE_IP = "198.51.100.7"  # TEST-NET-2: advertised only, never sent to


def discovery_config(port: int, health: int) -> dict[str, Any]:
    gw = UDP_GATEWAY.replace(
        "metadata: {name: gw, namespace: stunner}",
        "metadata: {name: gw, namespace: stunner, annotations: "
        '{stunner.l7mp.io/enable-relay-address-discovery: "true"}}',
    )
    renderer = Renderer()
    renderer.apply(objects_from_yaml(HIERARCHY) + objects_from_yaml(gw))
    rendered = renderer.configs()["stunner/gw"].listeners[0].address
    assert rendered == "__node_address_placeholder"
    config = base_config(health, {"udp": port})
    config["listeners"][0]["address"] = rendered
    return config


async def relayed_ip(port: int) -> str:
    transport, _ = await create_turn_endpoint(
        TurnReceiver, server_addr=("127.0.0.1", port), username=USER, password=PASSWORD
    )
    try:
        return str(transport.get_extra_info("sockname")[0])
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"STUNNERD_NODE_ADDRESS": NODE_IP, "STUNNER_ADDR": "127.0.0.1"}, NODE_IP),
        ({"STUNNERD_NODE_ADDRESS": "", "STUNNER_ADDR": "127.0.0.1"}, "127.0.0.1"),
    ],
    ids=["configured-node-address", "pod-address"],
)
async def test_stunnerd_relays_from_the_node_address(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    port = free_udp_tcp_port()
    proc = ManagedStunnerd(tmp_path, discovery_config(port, free_port()), env=env)
    try:
        status = await proc.ready()
        assert status["listeners"][0]["address"] == "__node_address_placeholder"
        assert await relayed_ip(port) == expected
    finally:
        await proc.close()


def test_without_a_node_address_the_config_is_refused_and_says_why(tmp_path: Path) -> None:
    port = free_udp_tcp_port()
    env = {"STUNNERD_NODE_ADDRESS": "", "STUNNER_ADDR": ""}
    proc = ManagedStunnerd(tmp_path, discovery_config(port, free_port()), env=env)
    try:
        code = proc.proc.proc.wait(timeout=30)  # the only config is refused: stunnerd exits
        assert code != 0
        assert "needs the node's address: set STUNNERD_NODE_ADDRESS" in proc.log()
    finally:
        proc.stop()
