"""The Dataplane's ``handoff`` through a real API server: the host-network DaemonSet whose new pod
takes over the old one's sockets through a hostPath Unix socket.

The operator (as the chart's ServiceAccount) writes the DaemonSet; the API server must keep the
``handoff`` field of the Dataplane (the chart's CRD declares it) and accept the DaemonSet with
its surge rollout, the hostPath volume, the root init container that makes the directory the
stunnerd user's, the handoff environment and the uid. A Dataplane that asks for the handoff on
a Deployment gets its Deployment without it, and the Gateway's Accepted condition says why.

Then a rollout on a kwok node (support.kwok_node; the test does the scheduler's binding): the
DaemonSet controller starts the new pod on the node while the old one runs, and deletes the old
one only once the new one has been Ready for ``minReadySeconds``, the handoff's time (the old
stunnerd answers the new pod's readiness probe until it hands its health socket over).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from stunner_operator.render.handoff import handoff_dir_command
from support.kube import KubeClient
from support.kube_stack import CONTROLLER_NAME, KubeStack
from support.kwok_node import NODE_NAME, KwokNode, kwok_node

# The rollout also builds kwok when the machine has no copy yet (about 3 minutes cold).
pytestmark = pytest.mark.timeout(900)

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
    assert spec["minReadySeconds"] == 10
    pod = spec["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["volumes"] == [
        {"name": "stunner-handoff", "hostPath": {"path": DIR, "type": "DirectoryOrCreate"}}
    ]
    (init,) = pod["initContainers"]
    assert init["image"] == "localhost/stunnerd:test"
    assert init["command"] == handoff_dir_command(10001, 10001, DIR)
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


@pytest.fixture(scope="module")
def kwok(stack: KubeStack, handoff: KubeClient) -> Iterator[KwokNode]:
    cluster = stack.cluster
    assert cluster.pki is not None
    with kwok_node(
        stack.admin,
        stack.workdir / "kwok",
        server=cluster.server,
        ca_cert=cluster.pki.ca_cert,
        admin_cert=(cluster.pki.admin_cert, cluster.pki.admin_key),
    ) as node:
        yield node.start()


def _edge_pods(client: KubeClient) -> list[dict[str, Any]]:
    selector = "stunner.l7mp.io/related-gateway-name=edge"
    return client.list("v1", "Pod", NS, label_selector=selector)


def _the_pod(client: KubeClient, count: int) -> Any:
    def found() -> dict[str, Any] | None:
        pods = _edge_pods(client)
        unbound = [p for p in pods if not p["spec"].get("nodeName")]
        return unbound[0] if len(pods) == count and unbound else None

    return client.wait_for(f"{count} handoff/edge pod(s), one new", found, timeout_s=60.0)


def _readiness(client: KubeClient) -> str:
    """The Ready conditions of the node and of the edge pods, for a failure's message."""

    def ready(obj: dict[str, Any] | None) -> str:
        conditions = ((obj or {}).get("status") or {}).get("conditions") or []
        found = [c for c in conditions if c.get("type") == "Ready"]
        if not found:
            return "no Ready condition"
        c = found[0]
        return f"Ready={c.get('status')} since {c.get('lastTransitionTime')} ({c.get('reason')})"

    pods = [f"{p['metadata']['name']}: {ready(p)}" for p in _edge_pods(client)]
    return f"node: {ready(client.get('v1', 'Node', NODE_NAME))}; pods: {pods}"


def test_a_rollout_starts_the_new_pod_beside_the_old_one(
    handoff: KubeClient, kwok: KwokNode
) -> None:
    old = _the_pod(handoff, 1)["metadata"]["name"]
    kwok.bind(NS, old)
    # A rollout replaces a pod that has been serving: wait until the old one is available
    # (Ready for minReadySeconds). The DaemonSet controller of Kubernetes 1.36 takes an old pod
    # not yet available as already lost (a replacement, not a surge); and when both pods turn
    # Ready within a second, its delayed resync for the new pod is folded into the earlier one
    # for the old pod, which comes before the new pod is available, and nothing syncs the
    # DaemonSet again: the old pod would stay until some later event.
    handoff.wait_for(
        "the old pod available",
        lambda: (
            ((handoff.get("apps/v1", "DaemonSet", "edge", NS) or {}).get("status", {})).get(
                "numberAvailable"
            )
            == 1
        ),
        timeout_s=60.0,
    )
    # a new template (the Dataplane's pod annotations): the DaemonSet rolls
    (dataplane,) = [
        d
        for d in yaml.safe_load_all(OBJECTS)
        if d and d["kind"] == "Dataplane" and d["metadata"]["name"] == "host-handoff"
    ]
    dataplane["spec"]["annotations"] = {"rollout": "2"}
    handoff.apply(dataplane)
    new = _the_pod(handoff, 2)
    assert new["spec"]["initContainers"][0]["name"] == "handoff-dir"
    # the old pod still runs, undeleted, on the node the new one is for
    pods = {p["metadata"]["name"]: p for p in _edge_pods(handoff)}
    assert pods[old]["spec"]["nodeName"] == NODE_NAME
    assert "deletionTimestamp" not in pods[old]["metadata"]
    kwok.bind(NS, new["metadata"]["name"])
    # Ready is not enough: the old pod stays minReadySeconds more, for the handoff
    still = {p["metadata"]["name"]: p for p in _edge_pods(handoff)}
    assert old in still
    assert "deletionTimestamp" not in still[old]["metadata"]

    def old_deleted() -> bool:
        # The controller deletes it; kwok finishes the deletion when its stage runs (later
        # on a loaded machine), so a deletion mark counts.
        pods = {p["metadata"]["name"]: p for p in _edge_pods(handoff)}
        return old not in pods or "deletionTimestamp" in pods[old]["metadata"]

    try:
        handoff.wait_for(
            "the old pod deleted once the new one is Ready", old_deleted, timeout_s=120.0
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}; {_readiness(handoff)}") from err
    assert new["metadata"]["name"] in {p["metadata"]["name"] for p in _edge_pods(handoff)}
