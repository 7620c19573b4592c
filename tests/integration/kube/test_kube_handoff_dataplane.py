"""The Dataplane's ``handoff`` through a real API server: the host-network DaemonSet whose new pod
takes over the old one's sockets through a hostPath Unix socket.

The operator (as the chart's ServiceAccount) writes the DaemonSet; the API server must keep the
``handoff`` field of the Dataplane (the chart's CRD declares it) and accept the DaemonSet with
its surge rollout, the hostPath volume, the root init container that makes the directory the
stunnerd user's, the handoff environment and the uid. A Dataplane that asks for the handoff on
a Deployment gets its Deployment without it, and the Gateway's Accepted condition says why.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from support.kube import KubeClient
from support.kube_stack import CONTROLLER_NAME, KubeStack

NS = "handoff"
DIR = "/var/run/stunner"


def _gateway(name: str, dataplane: str, spec: str) -> str:
    return f"""
apiVersion: stunner.l7mp.io/v1
kind: Dataplane
metadata: {{name: {dataplane}}}
spec: {spec}
---
apiVersion: stunner.l7mp.io/v1
kind: GatewayConfig
metadata: {{name: {name}, namespace: {NS}}}
spec: {{dataplane: {dataplane}, authType: static, userName: user-h, password: pass-h}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {NS}-{name}}}
spec:
  controllerName: {CONTROLLER_NAME}
  parametersRef: {{group: stunner.l7mp.io, kind: GatewayConfig, name: {name}, namespace: {NS}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: {NS}}}
spec:
  gatewayClassName: {NS}-{name}
  listeners: [{{name: udp, port: 3478, protocol: TURN-UDP}}]
"""


OBJECTS = (
    f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\n"
    + _gateway(
        "edge",
        "host-handoff",
        '{image: "localhost/stunnerd:test", dataplaneResource: DaemonSet, hostNetwork: true, '
        "handoff: true}",
    )
    + "---\n"
    + _gateway("plain", "deployment-handoff", '{image: "localhost/stunnerd:test", handoff: true}')
)


@pytest.fixture(scope="module")
def handoff(stack: KubeStack) -> KubeClient:
    client = stack.admin
    for doc in yaml.safe_load_all(OBJECTS):
        if doc:
            client.apply(doc)
    return client


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_api_server_keeps_the_handoff_field(handoff: KubeClient) -> None:
    dataplane = handoff.get("stunner.l7mp.io/v1", "Dataplane", "host-handoff")
    assert dataplane is not None
    assert dataplane["spec"]["handoff"] is True


def test_the_api_server_accepts_the_handoff_daemonset(handoff: KubeClient) -> None:
    ds = handoff.wait_for(
        "DaemonSet handoff/edge", lambda: handoff.get("apps/v1", "DaemonSet", "edge", NS)
    )
    spec = ds["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["volumes"] == [
        {"name": "stunner-handoff", "hostPath": {"path": DIR, "type": "DirectoryOrCreate"}}
    ]
    (init,) = pod["initContainers"]
    assert init["image"] == "localhost/stunnerd:test"
    assert init["command"] == ["install", "-d", "-o", "10001", "-g", "10001", "-m", "0700", DIR]
    assert init["securityContext"] == {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    assert init["volumeMounts"] == [{"name": "stunner-handoff", "mountPath": DIR}]
    (container,) = pod["containers"]
    assert container["volumeMounts"] == [{"name": "stunner-handoff", "mountPath": DIR}]
    assert container["securityContext"] == {
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "runAsNonRoot": True,
    }
    env = _env(container)
    assert env["STUNNERD_HANDOFF_SOCKET"] == f"{DIR}/{NS}_edge.sock"
    assert env["STUNNERD_HANDOFF_IDLE"] == "true"
    # no declared ports, so no host ports for the scheduler to find taken by the old pod
    assert "ports" not in container
    assert handoff.get("apps/v1", "Deployment", "edge", NS) is None


def test_handoff_on_a_deployment_is_left_out_and_the_status_says_why(
    handoff: KubeClient,
) -> None:
    dep = handoff.wait_for(
        "Deployment handoff/plain", lambda: handoff.get("apps/v1", "Deployment", "plain", NS)
    )
    pod = dep["spec"]["template"]["spec"]
    assert "volumes" not in pod
    assert "initContainers" not in pod
    assert not any(name.startswith("STUNNERD_HANDOFF") for name in _env(pod["containers"][0]))

    def accepted_message() -> str | None:
        gw = handoff.get("gateway.networking.k8s.io/v1", "Gateway", "plain", NS) or {}
        conditions = gw.get("status", {}).get("conditions", [])
        found = [c["message"] for c in conditions if c["type"] == "Accepted"]
        return found[0] if found and "handoff" in found[0] else None

    message = handoff.wait_for("the Gateway's Accepted condition", accepted_message)
    assert "handoff needs dataplaneResource: DaemonSet and hostNetwork: true" in message
