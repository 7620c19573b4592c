"""A real kubelet runs our stunnerd image: the node registers and is Ready, a stunnerd pod with
the chart's security context passes its readiness probe, and kube-proxy takes a Service's
ClusterIP and NodePort to it (HTTP to the health port, a TURN Allocate over UDP)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from aioice import stun

from support import gobin
from support.chart import render
from support.kube_stack import CHART_VALUES
from support.node_images import stunnerd_image
from support.node_stack import NODE_IP, NODE_NAME, NodeStack

TURN_PORT = 3478
UDP_TRANSPORT = 0x11000000  # REQUESTED-TRANSPORT: UDP (17) in the first byte, RFC 5766 §14.7
HEALTH_PORT = 8086


def chart_dataplane() -> dict[str, Any]:
    """The spec of the Dataplane "default" the chart installs (what the operator renders from)."""
    for obj in render(CHART_VALUES).objects:
        if obj["kind"] == "Dataplane" and obj["metadata"]["name"] == "default":
            spec: dict[str, Any] = obj["spec"]
            return spec
    raise AssertionError("the chart renders no Dataplane default")


def stunnerd_pod(name: str, namespace: str) -> dict[str, Any]:
    """A stunnerd pod as the operator renders one from the chart's Dataplane (its command,
    env, resources, probes and container security context), serving a static TURN URI instead
    of following a CDS (none runs in this cluster)."""
    dp = chart_dataplane()
    args = [a for a in dp["args"] if a != "-w"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "stunnerd",
                    "image": stunnerd_image(),
                    "imagePullPolicy": "Never",
                    "command": dp["command"],
                    "args": [*args, f"turn://user-1:pass-1@0.0.0.0:{TURN_PORT}?transport=udp"],
                    "env": dp.get("env", []),
                    "resources": dp["resources"],
                    "ports": [
                        {"name": "turn-udp", "containerPort": TURN_PORT, "protocol": "UDP"},
                        {"name": "health", "containerPort": HEALTH_PORT},
                    ],
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": HEALTH_PORT},
                        "periodSeconds": 2,
                    },
                    "livenessProbe": {
                        "httpGet": {"path": "/live", "port": HEALTH_PORT},
                        "periodSeconds": 15,
                    },
                    "securityContext": dp["containerSecurityContext"],
                }
            ],
        },
    }


def wait_pod_ready(node: NodeStack, name: str, namespace: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = node.admin.get("v1", "Pod", name, namespace) or {}
        conds = (pod.get("status") or {}).get("conditions") or []
        ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        return pod if ok else None

    pod: dict[str, Any] = node.admin.wait_for(f"pod {namespace}/{name} Ready", ready, timeout_s=90)
    return pod


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def root_mount_options(pid: int) -> list[str]:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[5].split(",")
    raise AssertionError(f"no root mount for pid {pid}")


def turn_allocate(host: str, port: int) -> stun.Message:
    """An unauthenticated TURN Allocate over UDP: a TURN server answers 401 with a nonce."""
    request = stun.Message(message_method=stun.Method.ALLOCATE, message_class=stun.Class.REQUEST)
    request.attributes["REQUESTED-TRANSPORT"] = UDP_TRANSPORT
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(1.0)
        for _ in range(10):
            sock.sendto(bytes(request), (host, port))
            try:
                data, _ = sock.recvfrom(4096)
            except TimeoutError:
                continue
            return stun.parse_message(data)
    raise AssertionError(f"no TURN answer from {host}:{port}")


def test_api_server_reports_the_pinned_release_version(node: NodeStack) -> None:
    version = node.admin.request("GET", "/version")
    assert version["gitVersion"] == gobin.kube_version()
    assert (version["major"], version["minor"]) == ("1", gobin.kube_version().split(".")[1])


def test_node_registers_and_is_ready(node: NodeStack) -> None:
    got = node.node()
    assert got is not None
    status = got["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    info = status["nodeInfo"]
    assert info["kubeletVersion"] == gobin.kube_version()
    assert info["kubeProxyVersion"] in ("", gobin.kube_version())
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert {"type": "InternalIP", "address": NODE_IP} in status["addresses"]
    assert got["metadata"]["name"] == NODE_NAME
    assert not [t for t in got["spec"].get("taints", []) if t["effect"] == "NoSchedule"]


def test_stunnerd_pod_runs_ready_with_the_charts_security_context(
    node: NodeStack, namespace: str
) -> None:
    node.admin.apply(stunnerd_pod("stunnerd", namespace))
    pod = wait_pod_ready(node, "stunnerd", namespace)

    container = pod["status"]["containerStatuses"][0]
    assert container["ready"]
    assert container["restartCount"] == 0
    pid = node.container_pid(container["containerID"])
    status = proc_status(pid)
    assert status["Uid"].split() == ["10001"] * 4
    assert status["Gid"].split() == ["10001"] * 4
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"] == "1"  # allowPrivilegeEscalation: false
    assert status["Seccomp"] == "2"  # seccompProfile RuntimeDefault: a filter
    assert "ro" in root_mount_options(pid)  # readOnlyRootFilesystem
    ready = httpx.get(f"http://{pod['status']['podIP']}:{HEALTH_PORT}/ready", timeout=5.0)
    assert ready.status_code == 200


def test_service_cluster_ip_and_node_port_reach_a_pod_through_kube_proxy(
    node: NodeStack, namespace: str
) -> None:
    node.admin.apply(stunnerd_pod("turn", namespace))
    wait_pod_ready(node, "turn", namespace)
    service = node.admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "turn", "namespace": namespace},
            "spec": {
                "type": "NodePort",
                "selector": {"app": "turn"},
                "ports": [
                    {"name": "turn-udp", "port": 3479, "targetPort": TURN_PORT, "protocol": "UDP"},
                    {"name": "health", "port": 18086, "targetPort": HEALTH_PORT},
                ],
            },
        }
    )
    cluster_ip = service["spec"]["clusterIP"]
    node_port = {p["name"]: p["nodePort"] for p in service["spec"]["ports"]}

    def answers(url: str) -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    node.admin.wait_for(
        f"ClusterIP {cluster_ip}:18086", lambda: answers(f"http://{cluster_ip}:18086/ready")
    )
    node.admin.wait_for(
        f"NodePort {NODE_IP}:{node_port['health']}",
        lambda: answers(f"http://{NODE_IP}:{node_port['health']}/ready"),
    )
    for host, port in ((cluster_ip, 3479), (NODE_IP, node_port["turn-udp"])):
        reply = turn_allocate(host, port)
        assert reply.message_class == stun.Class.ERROR, (host, port)
        assert reply.attributes["ERROR-CODE"][0] == 401
        assert reply.attributes["NONCE"]


def test_pod_resolves_a_service_name_through_cluster_dns(node: NodeStack, namespace: str) -> None:
    if node.dns_unavailable:
        pytest.skip(f"no cluster DNS: {node.dns_unavailable}")
    service = node.admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "named", "namespace": namespace},
            "spec": {"selector": {"app": "none"}, "ports": [{"port": 80}]},
        }
    )
    lookup = (
        "import socket; "
        f"print(socket.gethostbyname('named.{namespace}.svc.cluster.local'), "
        "socket.gethostbyname('named'))"  # the search path of the pod's resolv.conf
    )
    pod = stunnerd_pod("resolver", namespace)
    pod["spec"]["restartPolicy"] = "Never"
    container = pod["spec"]["containers"][0]
    container.update(command=["/opt/stunner/bin/python", "-c", lookup], args=[])
    for probe in ("readinessProbe", "livenessProbe"):
        del container[probe]
    node.admin.apply(pod)

    def finished() -> str | None:
        got = node.admin.get("v1", "Pod", "resolver", namespace) or {}
        phase = (got.get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = node.admin.wait_for("resolver pod finished", finished, timeout_s=90)
    # Through the API server, which asks the kubelet: its authentication and authorization too.
    log = node.admin.request("GET", f"/api/v1/namespaces/{namespace}/pods/resolver/log")
    assert phase == "Succeeded", log
    assert log.split() == [service["spec"]["clusterIP"]] * 2


IN_CLUSTER_PROBE = """\
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
token = open(f"{sa}/token").read()
context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
request = urllib.request.Request(
    f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=json.dumps(review).encode(),
    headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
)
with urllib.request.urlopen(request, context=context, timeout=10) as reply:
    print(host, json.load(reply)["status"]["userInfo"]["username"])
"""


def test_pod_reaches_the_api_server_with_its_in_cluster_configuration(
    node: NodeStack, namespace: str
) -> None:
    """The ServiceAccount token and ca.crt at their standard path, KUBERNETES_SERVICE_HOST (the
    ``kubernetes`` Service, whose endpoint the lease reconciler keeps on the node IP) and a
    serving certificate that names 10.96.0.1: what the operator's in-cluster config uses."""
    slices = node.admin.list(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        "default",
        label_selector="kubernetes.io/service-name=kubernetes",
    )
    addresses = [a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]]
    assert addresses == [NODE_IP]
    pod = stunnerd_pod("in-cluster", namespace)
    pod["spec"]["restartPolicy"] = "Never"
    container = pod["spec"]["containers"][0]
    container.update(command=["/opt/stunner/bin/python", "-c", IN_CLUSTER_PROBE], args=[])
    for probe in ("readinessProbe", "livenessProbe"):
        del container[probe]
    node.admin.apply(pod)

    def finished() -> str | None:
        got = node.admin.get("v1", "Pod", "in-cluster", namespace) or {}
        phase = (got.get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = node.admin.wait_for("in-cluster pod finished", finished, timeout_s=90)
    log = node.admin.request("GET", f"/api/v1/namespaces/{namespace}/pods/in-cluster/log")
    assert phase == "Succeeded", log
    assert log.split() == ["10.96.0.1", f"system:serviceaccount:{namespace}:default"]
