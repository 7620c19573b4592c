"""What a real API server does to a controller: compaction, restarts, leases, an authorizer.

This module's cluster sends watches straight to etcd (no watch cache) and compacts etcd every
few seconds, and the operator renews its watches every two seconds, so a watch resumed after
the operator was away past a compaction really gets ``410 Gone``. Then: an API server restart
in the middle of edits, a second operator replica that takes over through the real Lease when
the leader dies, and, last, the audit log of the whole module held against the chart's RBAC:
the operator, running as the chart's ServiceAccount, was never refused, and the chart grants
no verb it did not use.
"""

from __future__ import annotations

import datetime
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from support.chart import render
from support.kube_stack import NAMESPACE, OPERATOR_SA, KubeStack
from support.ports import free_udp_tcp_port

GATEWAY = "edge"
SA_USER = f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    stack = KubeStack(
        tmp_path_factory.mktemp("kube-resilience"),
        watch_cache=False,
        compaction_interval_s=2,
        operator_env={"OPERATOR_WATCH_TIMEOUT_S": "2"},
    )
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


def _hierarchy() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": {"name": "config", "namespace": NAMESPACE},
            "spec": {
                "realm": "stunner.l7mp.io",
                "authType": "static",
                "userName": "u",
                "password": "p",
            },
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "stunner"},
            "spec": {
                "controllerName": "stunner.l7mp.io/gateway-operator",
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": "config",
                    "namespace": NAMESPACE,
                },
            },
        },
    ]


def _gateway(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY, "namespace": NAMESPACE},
        "spec": {
            "gatewayClassName": "stunner",
            "addresses": [{"type": "IPAddress", "value": "192.0.2.10"}],
            "listeners": [{"name": "udp", "port": port, "protocol": "TURN-UDP"}],
        },
    }


def _served_port(stack: KubeStack) -> int | None:
    config = stack.cds_configs().get(f"{NAMESPACE}/{GATEWAY}")
    listeners = (config or {}).get("listeners") or []
    return int(listeners[0]["port"]) if listeners else None


def _wait_port(stack: KubeStack, port: int, what: str, timeout_s: float = 30.0) -> None:
    stack.admin.wait_for(what, lambda: _served_port(stack) == port, timeout_s=timeout_s)


def _edit_port(stack: KubeStack) -> int:
    port = free_udp_tcp_port()
    stack.admin.apply(_gateway(port))
    return port


def test_an_object_the_api_server_refuses_is_reported_once_not_retried_forever(
    stack: KubeStack,
) -> None:
    stack.admin.apply_all(_hierarchy())
    loopback = _gateway(free_udp_tcp_port())
    loopback["spec"]["addresses"] = [{"type": "IPAddress", "value": "127.0.0.1"}]
    stack.admin.apply(loopback)
    operator = stack.operators[0]
    stack.admin.wait_for(
        "the refusal in the operator's log",
        lambda: "the API server refused Service stunner/edge" in operator.output(),
    )
    time.sleep(3.0)  # a retry loop would have tried again by now (it retries each second)
    assert operator.output().count("the API server refused Service stunner/edge") == 1


def test_an_edit_made_while_the_operator_was_away_past_a_compaction_is_not_lost(
    stack: KubeStack,
) -> None:
    stack.admin.apply_all(_hierarchy())
    _wait_port(stack, _edit_port(stack), "the first config")
    operator = stack.operators[0]
    operator.proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(3):
            last = _edit_port(stack)
        # Past several compactions (every 2 s) and the server's end of the open watch.
        time.sleep(7.0)
    finally:
        operator.proc.send_signal(signal.SIGCONT)
    _wait_port(stack, last, "the last edit made while the operator was stopped")
    stack.admin.wait_for(
        "the operator's 410 and new list",
        lambda: "expired; listing again" in operator.output(),
        timeout_s=15.0,
    )


def test_edits_across_an_api_server_restart_are_not_lost(stack: KubeStack) -> None:
    before = _edit_port(stack)
    _wait_port(stack, before, "the edit before the restart")
    stack.cluster.stop_apiserver()
    time.sleep(1.0)  # the operator's watches and writes fail meanwhile
    stack.cluster.start_apiserver()
    after = _edit_port(stack)
    _wait_port(stack, after, "the edit after the restart", timeout_s=60.0)


def _leader(stack: KubeStack) -> str:
    lease = stack.admin.get(
        "coordination.k8s.io/v1", "Lease", "stunner-gateway-operator", NAMESPACE
    )
    return str(((lease or {}).get("spec") or {}).get("holderIdentity", ""))


def test_a_second_replica_takes_over_through_the_lease_when_the_leader_dies(
    stack: KubeStack,
) -> None:
    first = _leader(stack)
    assert first, "no operator holds the Lease"
    standby = stack.start_operator()
    time.sleep(2.0)
    assert _leader(stack) == first, "the standby replica took a lease that was being renewed"
    stack.operators[0].stop(signal.SIGKILL)
    stack.admin.wait_for("a new leader", lambda: _leader(stack) not in {"", first}, timeout_s=30)
    port = _edit_port(stack)
    _wait_port(stack, port, "an edit rendered by the new leader")
    assert "leading as" in standby.output()


def _granted(stack: KubeStack) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the chart's ClusterRole and Role give the operator."""
    rendered = render({"image": {"registry": "localhost"}}, release="stunner", namespace=NAMESPACE)
    out = set()
    for obj in rendered.objects:
        if obj["kind"] in {"ClusterRole", "Role"} and obj["metadata"]["name"].startswith(
            "stunner-operator"
        ):
            for rule in obj["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            out.add((group, resource, verb))
    return out


# A restarted API server is ready before its RBAC caches have every Role again: for a moment
# it refuses what it will allow (the operator retries). Refusals in that window are not ours.
RBAC_WARMUP_S = 10.0


def _after_restart(stack: KubeStack, timestamp: str) -> bool:
    when = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    restarts = stack.cluster.apiserver_ready_at[1:]
    return any(ready - 5.0 <= when <= ready + RBAC_WARMUP_S for ready in restarts)


def _used(stack: KubeStack) -> tuple[set[tuple[str, str, str]], list[str]]:
    used, refused = set(), []
    for event in stack.cluster.audit_events():
        if event.get("user", {}).get("username") != SA_USER or "objectRef" not in event:
            continue
        ref = event["objectRef"]
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        key = (ref.get("apiGroup", ""), resource, event["verb"])
        used.add(key)
        if event["verb"] == "patch" and event.get("responseStatus", {}).get("code") == 201:
            # A server-side apply that created the object was also authorized as "create".
            used.add((key[0], key[1], "create"))
        if event.get("responseStatus", {}).get("code") == 403:
            if _after_restart(stack, event["stageTimestamp"]):
                continue
            refused.append(f"{event['verb']} {event.get('requestURI')}")
    return used, refused


def _routes() -> list[dict[str, Any]]:
    rule = {"backendRefs": [{"group": "stunner.l7mp.io", "kind": "StaticService", "name": "peers"}]}
    return [
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "StaticService",
            "metadata": {"name": "peers", "namespace": NAMESPACE},
            "spec": {"prefixes": ["127.0.0.1/32"]},
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "UDPRoute",
            "metadata": {"name": "stunner-route", "namespace": NAMESPACE},
            "spec": {"parentRefs": [{"name": GATEWAY}], "rules": [rule]},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "UDPRoute",
            "metadata": {"name": "gateway-api-route", "namespace": NAMESPACE},
            "spec": {"parentRefs": [{"name": GATEWAY}], "rules": [rule]},
        },
    ]


def _route_status(stack: KubeStack, api_version: str, name: str) -> list[Any]:
    route = stack.admin.get(api_version, "UDPRoute", name, NAMESPACE) or {}
    return list((route.get("status") or {}).get("parents") or [])


def _exists(stack: KubeStack, kind: str) -> bool:
    return stack.admin.get("apps/v1", kind, GATEWAY, NAMESPACE) is not None


def _config_dataplane(stack: KubeStack, dataplane: str | None) -> None:
    config = _hierarchy()[0]
    if dataplane:
        config["spec"]["dataplane"] = dataplane
    stack.admin.apply(config)


def test_the_operator_as_its_service_account_was_never_refused_and_uses_every_verb_granted(
    stack: KubeStack,
) -> None:
    client = stack.admin
    # The rest of a full scenario: both kinds of routes get a status; the Gateway moves to a
    # DaemonSet dataplane and back (each move deletes the other workload), then to another
    # controller's class, and is deleted.
    client.apply_all(_routes())
    client.wait_for(
        "both routes' statuses",
        lambda: (
            _route_status(stack, "stunner.l7mp.io/v1", "stunner-route")
            and _route_status(stack, "gateway.networking.k8s.io/v1", "gateway-api-route")
        ),
    )
    client.apply(
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "Dataplane",
            "metadata": {"name": "per-node"},
            "spec": {"image": "localhost/stunner-stunnerd:test", "dataplaneResource": "DaemonSet"},
        }
    )
    _config_dataplane(stack, "per-node")
    client.wait_for(
        "a DaemonSet in place of the Deployment",
        lambda: _exists(stack, "DaemonSet") and not _exists(stack, "Deployment"),
    )
    _config_dataplane(stack, None)
    client.wait_for(
        "the Deployment back, the DaemonSet gone",
        lambda: _exists(stack, "Deployment") and not _exists(stack, "DaemonSet"),
    )
    # A Gateway handed to another controller keeps existing: the operator removes its objects.
    other = _gateway(free_udp_tcp_port())
    other["spec"]["gatewayClassName"] = "not-stunner"
    client.apply(other)
    client.wait_for(
        "the Service and Deployment of a Gateway no longer ours gone",
        lambda: (
            not _exists(stack, "Deployment")
            and client.get("v1", "Service", GATEWAY, NAMESPACE) is None
        ),
    )
    client.delete("gateway.networking.k8s.io/v1", "Gateway", GATEWAY, NAMESPACE)
    used, refused = _used(stack)
    assert refused == []
    unused = sorted(_granted(stack) - used)
    assert unused == [], f"the chart grants verbs the operator never used: {unused}"
