"""Upstream's premium dataplane through a real API server: a DaemonSet on the host network, and
relay address discovery from real Node objects.

The operator (as the chart's ServiceAccount) writes the DaemonSet; the API server must accept it
with its rolling update, host networking, DNS policy and host ports. Two Nodes carry their
addresses in their status, as a kubelet would write them; the operator publishes the one with
an ExternalIP, the CDS fills it in for a stunnerd that names that node, and stunnerd gives it
to its clients in XOR-RELAYED-ADDRESS.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import yaml
from aioice.turn import create_turn_endpoint

from support.kube import KubeClient
from support.kube_stack import CONTROLLER_NAME, KubeStack
from support.ports import free_port, free_udp_tcp_port
from support.stunnerd_process import ManagedStunnerd, TurnReceiver

NS = "premium"
EXTERNAL_IP = "203.0.113.21"
LISTENER_PORT = free_udp_tcp_port()

OBJECTS = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: stunner.l7mp.io/v1
kind: Dataplane
metadata: {{name: host-daemonset}}
spec: {{image: "localhost/stunnerd:test", dataplaneResource: DaemonSet, hostNetwork: true}}
---
apiVersion: stunner.l7mp.io/v1
kind: GatewayConfig
metadata: {{name: premium, namespace: {NS}}}
spec: {{dataplane: host-daemonset, authType: static, userName: user-p, password: pass-p}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: premium}}
spec:
  controllerName: {CONTROLLER_NAME}
  parametersRef: {{group: stunner.l7mp.io, kind: GatewayConfig, name: premium, namespace: {NS}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: edge
  namespace: {NS}
  annotations:
    stunner.l7mp.io/enable-relay-address-discovery: "true"
    stunner.l7mp.io/targetport: '{{"udp": {LISTENER_PORT}}}'
spec:
  gatewayClassName: premium
  listeners: [{{name: udp, port: 3478, protocol: TURN-UDP}}]
"""

NODES = {
    "premium-node-a": [
        {"type": "InternalIP", "address": "10.1.0.11"},
        {"type": "ExternalIP", "address": EXTERNAL_IP},
    ],
    "premium-node-b": [{"type": "InternalIP", "address": "10.1.0.12"}],
}


@pytest.fixture(scope="module")
def premium(stack: KubeStack) -> KubeStack:
    """The folder's test cluster (chart, Redis, CDS, operator), with the Nodes and objects."""
    client = stack.admin
    for name, addresses in NODES.items():
        client.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        client.patch_status("v1", "Node", name, None, {"addresses": addresses})
    for doc in yaml.safe_load_all(OBJECTS):
        if doc:
            client.apply(doc)
    return stack


def cds_config(stack: KubeStack, node: str) -> dict[str, Any] | None:
    headers = {"Authorization": f"Bearer {stack.cds_token}"} if stack.cds_token else {}
    reply = httpx.get(
        f"{stack.cds_url}/api/v1/configs/{NS}/edge",
        params={"node": node},
        headers=headers,
        timeout=5.0,
    )
    if reply.status_code == 404:
        return None
    reply.raise_for_status()
    return dict(reply.json())


def test_the_api_server_accepts_the_host_network_daemonset(premium: KubeStack) -> None:
    client: KubeClient = premium.admin
    ds = client.wait_for(
        "DaemonSet premium/edge", lambda: client.get("apps/v1", "DaemonSet", "edge", NS)
    )
    spec = ds["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    pod = spec["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    (container,) = pod["containers"]
    assert {"containerPort": LISTENER_PORT, "hostPort": LISTENER_PORT, "protocol": "UDP"} in [
        {k: p[k] for k in ("containerPort", "hostPort", "protocol") if k in p}
        for p in container["ports"]
    ]
    assert client.get("apps/v1", "Deployment", "edge", NS) is None


async def test_relay_address_discovery_uses_the_external_ip_of_the_node(
    premium: KubeStack, tmp_path: Any
) -> None:
    client = premium.admin

    def patched(node: str) -> str | None:
        config = cds_config(premium, node)
        return None if config is None else str(config["listeners"][0]["address"])

    client.wait_for(
        "the CDS answers node-a with its ExternalIP",
        lambda: patched("premium-node-a") == EXTERNAL_IP,
    )
    assert patched("premium-node-b") == "$STUNNER_ADDR"  # no ExternalIP: the pod's address

    env = {"STUNNER_NODENAME": "premium-node-a", "STUNNER_ADDR": "127.0.0.1"}
    if premium.cds_token:
        env["CDS_TOKEN"] = premium.cds_token
    proc = ManagedStunnerd(
        tmp_path, None, "-w", "--id", f"{NS}/edge",
        origin=premium.cds_url, health=free_port(), env=env,
    )  # fmt: skip
    try:
        status = await proc.ready()
        assert status["listeners"][0]["address"] == EXTERNAL_IP, json.dumps(status)
        transport, _ = await create_turn_endpoint(
            TurnReceiver,
            server_addr=("127.0.0.1", LISTENER_PORT),
            username="user-p",
            password="pass-p",
        )
        try:
            assert transport.get_extra_info("sockname")[0] == EXTERNAL_IP
        finally:
            transport.close()
    finally:
        await proc.close()
