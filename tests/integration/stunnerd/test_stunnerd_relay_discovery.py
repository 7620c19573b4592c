"""Relay address discovery: the operator renders the node-address placeholder for a Gateway with
`stunner.l7mp.io/enable-relay-address-discovery`, and stunnerd relays from the node's address.

The operator publishes each Node's ExternalIP; the CDS gives a stunnerd that names its node
(`STUNNER_NODENAME`) that address in place of the placeholder. Without a CDS filling it in,
stunnerd takes the node's address from its settings (`STUNNERD_NODE_ADDRESS`, else
`STUNNER_ADDR`). Either way it is the XOR-RELAYED-ADDRESS clients get.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from aioice.turn import create_turn_endpoint

from stunner_operator.publish import RedisConfigSink
from stunner_operator.render.dataplane import node_addresses
from stunner_operator.render.engine import Renderer
from support.cds_server import CdsServer
from support.operator import HIERARCHY, UDP_GATEWAY, objects_from_yaml
from support.ports import free_port, free_udp_tcp_port
from support.redis_server import RedisServer
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
    message = "needs the node's address: set STUNNERD_NODE_ADDRESS"
    try:
        for _ in range(300):  # refused at once; stunnerd may exit or wait for a better config
            if message in proc.log():
                break
            time.sleep(0.1)
        assert message in proc.log()
        assert "ready on port" not in proc.log()
    finally:
        proc.stop()


NODES = """
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses:
  - {type: InternalIP, address: 10.0.0.11}
  - {type: ExternalIP, address: 203.0.113.10}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
status:
  addresses: [{type: InternalIP, address: 10.0.0.12}]
---
apiVersion: v1
kind: Node
metadata: {name: node-c}
status:
  addresses: [{type: InternalIP, address: 10.0.0.13}, {type: ExternalDNS, address: localhost}]
"""


async def cds_listener_address(cds: CdsServer, node: str) -> str:
    async with httpx.AsyncClient(timeout=5) as client:
        reply = await client.get(f"{cds.url}/api/v1/configs/stunner/gw", params={"node": node})
    reply.raise_for_status()
    return str(reply.json()["listeners"][0]["address"])


async def test_the_cds_gives_each_node_its_external_ip_and_stunnerd_relays_from_it(
    tmp_path: Path, redis: RedisServer, cds: CdsServer
) -> None:
    gw = UDP_GATEWAY.replace(
        "metadata: {name: gw, namespace: stunner}",
        "metadata: {name: gw, namespace: stunner, annotations: "
        '{stunner.l7mp.io/enable-relay-address-discovery: "true"}}',
    )
    renderer = Renderer()
    renderer.apply(objects_from_yaml(HIERARCHY + "---\n" + gw + "---\n" + NODES))
    port = free_udp_tcp_port()
    config = renderer.configs()["stunner/gw"]
    listener = config.listeners[0].model_copy(update={"port": port})
    config = config.model_copy(update={"listeners": (listener,)})
    sink = RedisConfigSink(redis.url, timeout_s=5)
    try:
        await sink.publish({"stunner/gw": config})
        assert await sink.publish_node_addresses(node_addresses(renderer.store.nodes()))
    finally:
        await sink.aclose()

    seen = ""
    for _ in range(200):  # the CDS reads the node addresses again every 2 s
        seen = await cds_listener_address(cds, "node-a")
        if seen == "203.0.113.10":
            break
        await asyncio.sleep(0.05)
    assert seen == "203.0.113.10"
    assert await cds_listener_address(cds, "node-b") == "$STUNNER_ADDR"  # no external address
    # only an ExternalDNS name: the CDS resolves it
    assert await cds_listener_address(cds, "node-c") in ("127.0.0.1", "::1")

    proc = ManagedStunnerd(
        tmp_path,
        None,
        "-w",
        "--id",
        "stunner/gw",
        origin=cds.url,
        health=free_port(),
        env={"STUNNER_NODENAME": "node-a", "STUNNER_ADDR": "127.0.0.1"},
    )
    try:
        status = await proc.ready()
        assert status["listeners"][0]["address"] == "203.0.113.10"
        transport, _ = await create_turn_endpoint(
            TurnReceiver, server_addr=("127.0.0.1", port), username="user-1", password="pass-1"
        )
        try:
            assert transport.get_extra_info("sockname")[0] == "203.0.113.10"
        finally:
            transport.close()
    finally:
        await proc.close()
