"""Dataplanes beyond the chart's default on the real node: the eBPF offload in a pod, and a
host-network DaemonSet that hands its sockets to its successor during a rollout.

The chart is installed by helm (support.node_helm) and the udp-echo pod runs, as in
test_node_helm.py. Then:

- the default Dataplane adds no capability to stunnerd's container;
- a Dataplane with ``offloadEngine: TC`` (the operator adds BPF and NET_ADMIN; stunnerd runs as
  root in its container, the only way Kubernetes makes added capabilities effective): its
  program attaches to the pod's eth0 (a CNI veth), a call through the Gateway's NodePort is
  relayed by the kernel (``/status`` on the pod IP's port 8086: channels, packets);
- a Dataplane with ``dataplaneResource: DaemonSet``, ``hostNetwork: true``, ``handoff: true``,
  bound to the node IP only (``STUNNERD_BIND_HOST``): a call to the node IP's listener port
  runs while the DaemonSet rolls (a pod annotation changed); the new pod takes the old one's
  sockets over the hostPath Unix socket; the datagrams lost are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.kube import KubeClient, KubeError
from support.kube_stack import NAMESPACE
from support.node_call import EchoCall, wait_turn_answers
from support.node_helm import NodeRelease, installed_release, pod_ready, pod_summary, udp_echo
from support.node_images import UDP_ECHO_PORT
from support.node_stack import NODE_IP, NodeStack
from support.ports import free_port
from support.turncat_harness import turncat

pytestmark = pytest.mark.timeout(900)

CONTROLLER = "stunner.l7mp.io/gateway-operator"
GATEWAY_API = "gateway.networking.k8s.io/v1"
STUNNER_API = "stunner.l7mp.io/v1"
HEALTH_PORT = 8086
HANDOFF_DIR = Path("/var/run/stunner")
LISTENER_PORT = 3478
SMALL = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}


@pytest.fixture(scope="module")
def release(node: NodeStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeRelease]:
    handoff_dir_existed = HANDOFF_DIR.exists()
    leftovers = [(GATEWAY_API, "GatewayClass", n) for n in (OFFLOAD, HANDOFF)]
    leftovers += [(STUNNER_API, "Dataplane", n) for n in (OFFLOAD, HANDOFF)]
    workdir = tmp_path_factory.mktemp("helm-dataplane")
    try:
        with installed_release(node, workdir, *leftovers) as rel:
            try:
                rel.admin.apply_all(udp_echo())
                rel.admin.wait_for(
                    "the udp-echo pod Ready",
                    lambda: [p for p in _pods(rel.admin, "app=udp-echo") if pod_ready(p)],
                    timeout_s=60,
                )
                yield rel
            finally:
                # Their pods go before the release does (the rest goes with the namespace).
                for name in (OFFLOAD, HANDOFF):
                    with contextlib.suppress(KubeError):
                        rel.admin.delete(GATEWAY_API, "Gateway", name, NAMESPACE)
    finally:
        if not handoff_dir_existed:
            shutil.rmtree(HANDOFF_DIR, ignore_errors=True)


def _pods(admin: KubeClient, selector: str) -> list[dict[str, Any]]:
    pods = admin.list("v1", "Pod", NAMESPACE, label_selector=selector)
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _gateway_pods(admin: KubeClient, gateway: str) -> list[dict[str, Any]]:
    return _pods(admin, f"stunner.l7mp.io/related-gateway-name={gateway}")


def _default_spec(admin: KubeClient) -> dict[str, Any]:
    default = admin.get(STUNNER_API, "Dataplane", "default")
    assert default is not None, "the chart made no Dataplane default"
    return dict(default["spec"])


def gateway_objects(name: str, dataplane: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """A Dataplane, and a GatewayConfig, GatewayClass, Gateway and UDPRoute (to udp-echo) that
    use it; each called ``name``."""
    return [
        {
            "apiVersion": STUNNER_API,
            "kind": "Dataplane",
            "metadata": {"name": name},
            "spec": dataplane,
        },
        {
            "apiVersion": STUNNER_API,
            "kind": "GatewayConfig",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "dataplane": name,
                "realm": "stunner.l7mp.io",
                "authType": "static",
                "userName": "user-1",
                "password": "pass-1",
            },
        },
        {
            "apiVersion": GATEWAY_API,
            "kind": "GatewayClass",
            "metadata": {"name": name},
            "spec": {
                "controllerName": CONTROLLER,
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": name,
                    "namespace": NAMESPACE,
                },
            },
        },
        {
            "apiVersion": GATEWAY_API,
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "gatewayClassName": name,
                "listeners": [{"name": "udp", "port": port, "protocol": "TURN-UDP"}],
            },
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1alpha2",
            "kind": "UDPRoute",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "parentRefs": [{"name": name}],
                "rules": [{"backendRefs": [{"name": "udp-echo", "port": UDP_ECHO_PORT}]}],
            },
        },
    ]


def _wait_gateway_pod(rel: NodeRelease, gateway: str, timeout_s: float = 120.0) -> dict[str, Any]:
    try:
        pods = rel.admin.wait_for(
            f"a Ready stunnerd pod of {gateway}",
            lambda: [p for p in _gateway_pods(rel.admin, gateway) if pod_ready(p)],
            timeout_s=timeout_s,
        )
    except TimeoutError as err:
        logs = [
            rel.pod_log(p["metadata"]["name"])[-2000:] for p in _gateway_pods(rel.admin, gateway)
        ]
        pytest.fail(f"{err}\n{pod_summary(rel.admin)}\n" + "\n".join(logs))
    return dict(pods[0])


def _echo_peer(admin: KubeClient) -> str:
    echo = admin.get("v1", "Service", "udp-echo", NAMESPACE)
    assert echo is not None
    return f"udp://{echo['spec']['clusterIP']}:{UDP_ECHO_PORT}"


def status(ip: str) -> dict[str, Any]:
    """stunnerd's ``/status`` on its health port."""
    with urllib.request.urlopen(f"http://{ip}:{HEALTH_PORT}/status", timeout=5) as resp:
        data: dict[str, Any] = json.load(resp)
    return data


@contextlib.asynccontextmanager
async def call_to(server: str, peer: str) -> AsyncIterator[EchoCall]:
    await asyncio.to_thread(wait_turn_answers, server)
    local = free_port(socket.SOCK_DGRAM)
    async with turncat(f"udp://127.0.0.1:{local}", server, peer) as tc:
        call = EchoCall(local)
        try:
            await call.start()
        except TimeoutError:
            pytest.fail(f"no echo through {server}:\n{tc.stderr}")
        try:
            yield call
        finally:
            await call.stop(drain_s=0.0)


def test_the_charts_default_dataplane_adds_no_capability(release: NodeRelease) -> None:
    spec = _default_spec(release.admin)
    assert spec.get("offloadEngine", "None") == "None"
    context = spec["containerSecurityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False


# -- the eBPF offload in a pod

OFFLOAD = "offload-tc"


def offload_dataplane(default: dict[str, Any]) -> dict[str, Any]:
    """The chart's default Dataplane with ``offloadEngine: TC``, stunnerd as root in its
    container (capabilities a pod adds are effective only for root), capabilities still
    ``drop: [ALL]``: the operator adds BPF and NET_ADMIN, nothing else."""
    context = {**default["containerSecurityContext"], "runAsUser": 0, "runAsNonRoot": False}
    return {
        **default,
        "offloadEngine": "TC",
        "containerSecurityContext": context,
        "resources": SMALL,
    }


def _in_netns(pid: int, *argv: str) -> str:
    done = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    )
    return done.stdout + done.stderr


def _capabilities(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {
        k: v.strip() for k, _, v in (line.partition(":") for line in lines) if k.startswith("Cap")
    }


async def test_the_tc_offload_attaches_to_the_pods_eth0_and_relays_a_call_in_the_kernel(
    release: NodeRelease,
) -> None:
    admin = release.admin
    started = time.monotonic()
    admin.apply_all(gateway_objects(OFFLOAD, offload_dataplane(_default_spec(admin)), 3478))
    pod = _wait_gateway_pod(release, OFFLOAD)
    ready_s = time.monotonic() - started
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["capabilities"] == {
        "add": ["BPF", "NET_ADMIN"],
        "drop": ["ALL"],
    }
    pod_ip = pod["status"]["podIP"]
    pid = release.node.container_pid(pod["status"]["containerStatuses"][0]["containerID"])
    caps = _capabilities(pid)
    before = status(pod_ip)
    offload = before.get("offload") or {}
    if not offload.get("active"):
        pytest.fail(
            f"offload not active: {offload}\ncapabilities {caps}\n"
            f"{release.pod_log(pod['metadata']['name'])[-3000:]}"
        )
    assert offload["engine"] == "TC"
    assert offload["interfaces"].get("eth0") == "TC", offload
    tc_filters = _in_netns(pid, "tc", "filter", "show", "dev", "eth0", "ingress")
    assert "stunner_tc" in tc_filters, tc_filters

    service = admin.get("v1", "Service", OFFLOAD, NAMESPACE)
    assert service is not None
    node_port = next(p["nodePort"] for p in service["spec"]["ports"] if p["protocol"] == "UDP")
    server = f"turn://user-1:pass-1@{NODE_IP}:{node_port}"
    async with call_to(server, _echo_peer(admin)) as call:
        mark = call.mark()
        during = await asyncio.to_thread(status, pod_ip)
        await asyncio.sleep(5.0)
        after = await asyncio.to_thread(status, pod_ip)
        report = await call.settled(mark)
    kernel = after["offload"]["packets"] - during["offload"]["packets"]
    print(
        f"\noffload: pod Ready {ready_s:.1f} s after the Gateway; capabilities {caps}; "
        f"status before the call {offload}, during {during['offload']}, after "
        f"{after['offload']}; in 5 s the call {report}; kernel-relayed packets {kernel} "
        "(each echoed datagram is relayed twice: client to peer, peer to client)\n"
        + tc_filters.strip()
    )
    assert after["offload"]["channels"] >= 1
    assert report.received > 0
    assert kernel >= report.received, (kernel, report)


# -- a host-network DaemonSet rolled with the handoff

HANDOFF = "handoff-ds"
ROLLOUT_ANNOTATION = "stunner.test/rollout"
AFTER_ROLLOUT_S = 5.0
OLD_POD_WAIT_S = 90.0


def handoff_dataplane(default: dict[str, Any], rollout: str) -> dict[str, Any]:
    """The chart's default Dataplane as a host-network DaemonSet with the handoff, bound to
    the node IP only (the listener and the health port; relays bind where listeners do)."""
    env = [*default.get("env", []), {"name": "STUNNERD_BIND_HOST", "value": NODE_IP}]
    return {
        **default,
        "dataplaneResource": "DaemonSet",
        "hostNetwork": True,
        "handoff": True,
        "env": env,
        "resources": SMALL,
        "annotations": {ROLLOUT_ANNOTATION: rollout},
    }


def _host_sockets(pids: set[int]) -> list[str]:
    """Where the given host processes' listening and unconnected sockets are bound (host
    network); connected ones (stunnerd's to the CDS) take the route's source address."""
    done = subprocess.run(["ss", "-Hlnptu"], capture_output=True, text=True, check=True, timeout=10)
    out = []
    for line in done.stdout.splitlines():
        if any(f"pid={p}," in line for p in pids):
            out.append(line.split()[4])
    return out


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int(
                    next(
                        line.split()[1]
                        for line in (entry / "status").read_text().splitlines()
                        if line.startswith("PPid:")
                    )
                )
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(children.get(p, []))
    return found


async def test_a_host_network_daemonset_rollout_hands_a_running_call_to_the_new_pod(
    release: NodeRelease,
) -> None:
    admin = release.admin
    default = _default_spec(admin)
    admin.apply_all(gateway_objects(HANDOFF, handoff_dataplane(default, "1"), LISTENER_PORT))
    old = _wait_gateway_pod(release, HANDOFF)
    daemonset = admin.get("apps/v1", "DaemonSet", HANDOFF, NAMESPACE)
    assert daemonset is not None
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }
    assert old["spec"]["hostNetwork"] is True
    pid = release.node.container_pid(old["status"]["containerStatuses"][0]["containerID"])
    await asyncio.to_thread(
        admin.wait_for,
        "the listener bound",
        lambda: f"{NODE_IP}:{LISTENER_PORT}" in _host_sockets(_descendants(pid)),
        timeout_s=30,
    )
    bound = _host_sockets(_descendants(pid))
    assert all(a.startswith(f"{NODE_IP}:") for a in bound), bound
    # A rollout replaces a pod that has been serving: the old one available (Ready for
    # minReadySeconds) first, as tests/integration/kube/test_kube_handoff_dataplane.py explains.
    await asyncio.to_thread(
        admin.wait_for,
        "the old pod available",
        lambda: (
            ((admin.get("apps/v1", "DaemonSet", HANDOFF, NAMESPACE) or {}).get("status", {})).get(
                "numberAvailable"
            )
            == 1
        ),
        timeout_s=60,
    )

    server = f"turn://user-1:pass-1@{NODE_IP}:{LISTENER_PORT}"
    old_name = old["metadata"]["name"]
    loop = asyncio.get_running_loop()
    async with call_to(server, _echo_peer(admin)) as call:
        await asyncio.sleep(1.0)
        relays = _host_sockets(_descendants(pid))
        assert all(a.startswith(f"{NODE_IP}:") for a in relays), relays
        mark = call.mark()
        admin.apply(gateway_objects(HANDOFF, handoff_dataplane(default, "2"), LISTENER_PORT)[0])

        def new_ready() -> list[dict[str, Any]]:
            return [
                p
                for p in _gateway_pods(admin, HANDOFF)
                if p["metadata"]["name"] != old_name and pod_ready(p)
            ]

        [new] = await asyncio.to_thread(
            admin.wait_for, "the new pod Ready", new_ready, timeout_s=120, interval_s=0.25
        )
        new_ready_s = loop.time() - mark[1]
        try:
            await asyncio.to_thread(
                admin.wait_for,
                "the old pod gone",
                lambda: admin.get("v1", "Pod", old_name, NAMESPACE) is None,
                timeout_s=OLD_POD_WAIT_S,
                interval_s=0.25,
            )
            old_state = "gone"
        except TimeoutError:
            # Seen once under load (average 11): the old pod still there after 180 s.
            left = admin.get("v1", "Pod", old_name, NAMESPACE) or {}
            old_state = (
                f"still there after {OLD_POD_WAIT_S:.0f} s (deletionTimestamp "
                f"{left.get('metadata', {}).get('deletionTimestamp')}); its log:\n"
                + release.pod_log(old_name)[-2000:]
            )
        old_gone_s = loop.time() - mark[1]
        await asyncio.sleep(AFTER_ROLLOUT_S)
        report = await call.settled(mark)
        tail = call.report_since((call.sent - 100, loop.time() - 2.0), call.mark())
        new_status = await asyncio.to_thread(status, NODE_IP)
    new_log = release.pod_log(new["metadata"]["name"])
    handoff_lines = [line for line in new_log.splitlines() if "handoff" in line.lower()]
    print(
        f"\nhandoff rollout: new pod Ready {new_ready_s:.1f} s after the Dataplane edit, "
        f"old pod {old_state} at {old_gone_s:.1f} s; the call over "
        f"{old_gone_s + AFTER_ROLLOUT_S:.0f} s: {report}; the new stunnerd's allocationCount "
        f"{new_status.get('allocationCount')}"
        "\n" + "\n".join(handoff_lines[-10:])
    )
    assert tail.received > 0, "the call is not relayed after the rollout"
    assert handoff_lines, new_log[-3000:]
