"""STUNner end to end on a real node: the chart, the operator (as its ServiceAccount) and the CDS
provision a Gateway whose stunnerd pod, from our image, runs under the kubelet, takes its config
from the CDS over the pod network and relays: a TURN allocation with the GatewayConfig's
credentials through the Gateway's Service (ClusterIP and NodePort, via kube-proxy)."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aioice import stun

from support.kube_stack import NAMESPACE, echo_gateway
from support.node_stack import NODE_IP, NodeStack
from support.node_stunner import NodeKubeStack

pytestmark = pytest.mark.timeout(420)

GATEWAY = "udp-gateway"
TURN_PORT = 3478
UDP_TRANSPORT = 0x11000000  # REQUESTED-TRANSPORT: UDP (17) in the first byte, RFC 5766 §14.7


@pytest.fixture(scope="module")
def stunner(node: NodeStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeKubeStack]:
    stack = NodeKubeStack(tmp_path_factory.mktemp("stunner"), node=node)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


def exchange(sock: socket.socket, request: stun.Message, to: tuple[str, int]) -> stun.Message:
    for _ in range(20):
        try:
            sock.sendto(bytes(request), to)
        except PermissionError:
            # kube-proxy's REJECT for a Service without endpoints: its rules lag the pod's
            # readiness (seen after test_node_helm.py's namespace had just been deleted).
            time.sleep(0.5)
            continue
        try:
            data, _ = sock.recvfrom(4096)
        except TimeoutError:
            continue
        return stun.parse_message(data)
    raise AssertionError(f"no TURN answer from {to}")


def allocate_request() -> stun.Message:
    return stun.Message(message_method=stun.Method.ALLOCATE, message_class=stun.Class.REQUEST)


def allocate(to: tuple[str, int], username: str, password: str) -> stun.Message:
    """A TURN Allocate over UDP with long-term credentials (RFC 5766 §6, RFC 5389 §10.2)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(1.0)
        request = stun.Message(
            message_method=stun.Method.ALLOCATE, message_class=stun.Class.REQUEST
        )
        request.attributes["REQUESTED-TRANSPORT"] = UDP_TRANSPORT
        challenge = exchange(sock, request, to)
        assert challenge.attributes["ERROR-CODE"][0] == 401
        realm, nonce = challenge.attributes["REALM"], challenge.attributes["NONCE"]
        request = stun.Message(
            message_method=stun.Method.ALLOCATE, message_class=stun.Class.REQUEST
        )
        request.attributes.update(
            {
                "REQUESTED-TRANSPORT": UDP_TRANSPORT,
                "USERNAME": username,
                "REALM": realm,
                "NONCE": nonce,
            }
        )
        key = hashlib.md5(f"{username}:{realm}:{password}".encode()).digest()
        request.add_message_integrity(key)
        return exchange(sock, request, to)


def ready_pods(stack: NodeKubeStack) -> list[dict[str, Any]]:
    pods = stack.admin.list(
        "v1", "Pod", NAMESPACE, label_selector=f"stunner.l7mp.io/related-gateway-name={GATEWAY}"
    )
    return [
        p
        for p in pods
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    ]


def test_the_operators_stunnerd_pod_runs_on_the_node_and_relays(stunner: NodeKubeStack) -> None:
    stunner.admin.apply_all(echo_gateway(GATEWAY, "udp-listener", TURN_PORT))
    try:
        pods = stunner.admin.wait_for(
            f"a Ready stunnerd pod of {GATEWAY}", lambda: ready_pods(stunner), timeout_s=120
        )
    except TimeoutError:
        pods = stunner.admin.list("v1", "Pod", NAMESPACE)
        log = Path(stunner.workdir / "operator-0.log").read_text()[-3000:]
        pytest.fail(f"no Ready stunnerd pod: {pods!r:.3000}\noperator log:\n{log}")
    pod = pods[0]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["STUNNER_CONFIG_ORIGIN"] == f"http://{NODE_IP}:{stunner.cds_port}"
    assert pod["spec"]["nodeName"] == "stunner-node"

    service = stunner.admin.get("v1", "Service", GATEWAY, NAMESPACE)
    assert service is not None
    port = next(p for p in service["spec"]["ports"] if p["protocol"] == "UDP")
    for to in ((service["spec"]["clusterIP"], port["port"]), (NODE_IP, port["nodePort"])):
        reply = allocate(to, "user-1", "pass-1")
        assert reply.message_class == stun.Class.RESPONSE, (to, reply.attributes)
        relayed_ip, _relayed_port = reply.attributes["XOR-RELAYED-ADDRESS"]
        assert relayed_ip == pod["status"]["podIP"]
