"""Upstream's premium fields, rendered: STUN mode, DaemonSet and host networking, relay address
discovery, the cluster-wide quota's settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stunner_common.crds import Node
from stunner_operator.__main__ import _options
from stunner_operator.render.dataplane import node_addresses
from stunner_operator.render.engine import Renderer
from stunner_operator.render.options import DEFAULT_LABEL_FILTER, RenderOptions
from stunner_operator.settings import OperatorSettings
from support.operator import HIERARCHY, UDP_GATEWAY, objects_from_yaml

Render = Callable[..., Renderer]


def gwconfig(fields: str) -> str:
    return HIERARCHY.replace("spec: {authType", f"spec: {{{fields}, authType")


def dataplane(fields: str) -> str:
    return HIERARCHY.replace(
        'spec: {image: "stunnerd:test"}', f'spec: {{image: "stunnerd:test", {fields}}}'
    )


def workload(r: Renderer) -> dict[str, Any]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.deployment is not None
    return gw.deployment


def test_stun_mode_renders_auth_none_without_credentials(render: Render) -> None:
    cfg = render(gwconfig("stunMode: true"), UDP_GATEWAY).configs()["stunner/gw"]
    assert cfg.auth.type == "none"
    assert cfg.auth.credentials == {}
    assert cfg.auth.realm == "stunner.l7mp.io"
    assert [ls.name for ls in cfg.listeners] == ["stunner/gw/udp"]


def test_stun_mode_false_keeps_the_configured_auth(render: Render) -> None:
    cfg = render(gwconfig("stunMode: false"), UDP_GATEWAY).configs()["stunner/gw"]
    assert cfg.auth.type == "static"
    assert cfg.auth.credentials == {"username": "user-1", "password": "pass-1"}


def test_auth_lifetime_travels_with_ephemeral_credentials(render: Render) -> None:
    text = HIERARCHY.replace(
        "spec: {authType: static, userName: user-1, password: pass-1}",
        "spec: {authType: ephemeral, sharedSecret: s3cret, authLifetime: 600}",
    )
    cfg = render(text, UDP_GATEWAY).configs()["stunner/gw"]
    assert cfg.auth.type == "ephemeral"
    assert cfg.auth.credentials == {"secret": "s3cret", "lifetime": "600"}


def test_auth_lifetime_is_not_rendered_for_static_auth(render: Render) -> None:
    cfg = render(gwconfig("authLifetime: 600"), UDP_GATEWAY).configs()["stunner/gw"]
    assert "lifetime" not in cfg.auth.credentials


def test_dataplane_resource_daemonset_renders_a_daemonset_with_a_surge_rollout(
    render: Render,
) -> None:
    ds = workload(render(dataplane("dataplaneResource: DaemonSet, replicas: 3"), UDP_GATEWAY))
    assert ds["apiVersion"] == "apps/v1"
    assert ds["kind"] == "DaemonSet"
    assert ds["metadata"]["name"] == "gw"
    assert "replicas" not in ds["spec"]  # one pod per node
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    labels = ds["spec"]["template"]["metadata"]["labels"]
    for expr in ds["spec"]["selector"]["matchExpressions"]:
        assert labels[expr["key"]] in expr["values"]
    pod = ds["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod
    assert pod["containers"][0]["name"] == "stunner-daemon"


def test_the_default_dataplane_resource_is_a_deployment(render: Render) -> None:
    dep = workload(render(HIERARCHY, UDP_GATEWAY))
    assert dep["kind"] == "Deployment"
    assert "updateStrategy" not in dep["spec"]


def test_host_network_renders_host_dns_policy_and_the_listener_ports(render: Render) -> None:
    gw = UDP_GATEWAY.replace(
        "  - {name: udp, port: 3478, protocol: TURN-UDP}",
        "  - {name: udp, port: 3478, protocol: TURN-UDP}\n"
        "  - {name: tcp, port: 3479, protocol: TURN-TCP}\n"
        "  - {name: dtls, port: 3480, protocol: TURN-DTLS}",
    )
    r = render(dataplane("dataplaneResource: DaemonSet, hostNetwork: true"), gw)
    ds = workload(r)
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    ports = pod["containers"][0]["ports"]
    assert ports == [
        {"name": "metrics-port", "containerPort": 8080},
        {"containerPort": 3478, "hostPort": 3478, "protocol": "UDP"},
        {"containerPort": 3479, "hostPort": 3479, "protocol": "TCP"},
        {"containerPort": 3480, "hostPort": 3480, "protocol": "UDP"},
    ]
    # two pods cannot hold one host port: the old pod goes first
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    # on the host network the pod IP is the node's: listeners and relays use it
    assert env["STUNNER_ADDR"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["STUNNER_NODENAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_host_network_ports_follow_the_targetport_annotation(render: Render) -> None:
    gw = UDP_GATEWAY.replace(
        "metadata: {name: gw, namespace: stunner}",
        "metadata: {name: gw, namespace: stunner, annotations: "
        "{stunner.l7mp.io/targetport: '{\"udp\": 13478}'}}",
    )
    r = render(dataplane("hostNetwork: true"), gw)
    dep = workload(r)
    assert dep["kind"] == "Deployment"
    ports = dep["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"containerPort": 13478, "hostPort": 13478, "protocol": "UDP"} in ports
    assert r.configs()["stunner/gw"].listeners[0].port == 13478


def test_an_unknown_dataplane_resource_renders_a_deployment_and_says_so(render: Render) -> None:
    r = render(dataplane("dataplaneResource: StatefulSet"), UDP_GATEWAY)
    assert workload(r)["kind"] == "Deployment"
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert any("dataplaneResource 'StatefulSet'" in w for w in gw.warnings)
    assert "stunner/gw" in r.configs()


def test_switching_to_a_daemonset_deletes_the_deployment(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY)
    assert workload(r)["kind"] == "Deployment"
    delta = r.apply(objects_from_yaml(dataplane("dataplaneResource: DaemonSet")))
    assert delta.deployments["stunner/gw"] is not None
    assert delta.deployments["stunner/gw"]["kind"] == "DaemonSet"
    assert ("Deployment", "stunner", "gw") in delta.resource_deletes


def test_disabled_managed_dataplane_deletes_the_daemonset(render: Render) -> None:
    gw = UDP_GATEWAY.replace(
        "metadata: {name: gw, namespace: stunner}",
        "metadata: {name: gw, namespace: stunner, annotations: "
        '{stunner.l7mp.io/disable-managed-dataplane: "true"}}',
    )
    render_ = render(dataplane("dataplaneResource: DaemonSet"), gw).gateway("stunner", "gw")
    assert render_ is not None
    assert render_.deployment is None
    assert render_.deletes == (("DaemonSet", "stunner", "gw"),)


def test_relay_address_discovery_puts_the_node_address_placeholder_in_every_listener(
    render: Render,
) -> None:
    gw = UDP_GATEWAY.replace(
        "metadata: {name: gw, namespace: stunner}",
        "metadata: {name: gw, namespace: stunner, annotations: "
        '{stunner.l7mp.io/enable-relay-address-discovery: "true"}}',
    )
    cfg = render(dataplane("hostNetwork: true"), gw).configs()["stunner/gw"]
    assert [ls.address for ls in cfg.listeners] == ["__node_address_placeholder"]
    assert cfg.listeners[0].public_address == "1.2.3.4"  # the Gateway's own still wins


def test_without_relay_address_discovery_listeners_relay_from_the_pod_address(
    render: Render,
) -> None:
    cfg = render(HIERARCHY, UDP_GATEWAY).configs()["stunner/gw"]
    assert [ls.address for ls in cfg.listeners] == ["$STUNNER_ADDR"]


def test_the_quota_redis_secret_reaches_the_pods_with_the_replica_count(render: Render) -> None:
    options = RenderOptions(quota_redis_secret="stunner-quota-redis")
    dep = workload(render(dataplane("replicas: 3"), UDP_GATEWAY, options=options))
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["STUNNERD_QUOTA_REDIS_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "stunner-quota-redis", "key": "url"}
    }
    assert env["STUNNERD_QUOTA_REPLICAS"]["value"] == "3"
    ds = workload(render(dataplane("dataplaneResource: DaemonSet"), UDP_GATEWAY, options=options))
    names = [e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert "STUNNERD_QUOTA_REDIS_URL" in names
    assert "STUNNERD_QUOTA_REPLICAS" not in names  # one pod per node: no fixed count


def test_without_a_quota_redis_secret_the_pods_count_alone(render: Render) -> None:
    dep = workload(render(HIERARCHY, UDP_GATEWAY))
    names = [e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert not [n for n in names if n.startswith("STUNNERD_QUOTA")]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (None, DEFAULT_LABEL_FILTER),
        ("", ()),
        ("team, argocd.argoproj.io/instance", ("team", "argocd.argoproj.io/instance")),
    ],
)
def test_the_upstream_label_filter_variable_sets_the_filter(
    monkeypatch: pytest.MonkeyPatch, env: str | None, expected: tuple[str, ...]
) -> None:
    monkeypatch.delenv("STUNNER_GATEWAY_OPERATOR_LABEL_FILTER", raising=False)
    if env is not None:
        monkeypatch.setenv("STUNNER_GATEWAY_OPERATOR_LABEL_FILTER", env)
    assert _options(OperatorSettings()).label_filter == expected


def test_a_filtered_label_stays_off_the_deployment(render: Render) -> None:
    gw = UDP_GATEWAY.replace(
        "metadata: {name: gw, namespace: stunner}",
        "metadata: {name: gw, namespace: stunner, labels: {team: a, keep: b}}",
    )
    dep = workload(render(HIERARCHY, gw, options=RenderOptions(label_filter=("team",))))
    assert "team" not in dep["metadata"]["labels"]
    assert dep["metadata"]["labels"]["keep"] == "b"


def test_the_upstream_controller_name_variable_sets_the_controller_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STUNNER_GATEWAY_OPERATOR_CONTROLLER_NAME", "example.com/other")
    assert _options(OperatorSettings()).controller_name == "example.com/other"


def test_dataplane_pod_fields_are_passed_through_as_upstream(render: Render) -> None:
    fields = (
        "command: [stunnerd], imagePullPolicy: Never, imagePullSecrets: [{name: regcred}],"
        " resources: {limits: {cpu: 2}}, containerSecurityContext: {runAsNonRoot: true},"
        " securityContext: {runAsUser: 1000}, tolerations: [{key: k, operator: Exists}],"
        " affinity: {nodeAffinity: {}},"
        " topologySpreadConstraints:"
        " [{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}]"
    )
    dep = workload(render(dataplane(fields), UDP_GATEWAY))
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["stunnerd"]
    assert container["imagePullPolicy"] == "Never"
    assert container["resources"] == {"limits": {"cpu": 2}}
    assert container["securityContext"] == {"runAsNonRoot": True}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["securityContext"] == {"runAsUser": 1000}
    assert pod["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert pod["affinity"] == {"nodeAffinity": {}}
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "zone"


def test_user_quota_and_log_level_reach_the_admin_config(render: Render) -> None:
    cfg = render(gwconfig("userQuota: 12, logLevel: 'all:DEBUG'"), UDP_GATEWAY).configs()
    admin = cfg["stunner/gw"].admin
    assert admin.user_quota == 12
    assert admin.loglevel == "all:DEBUG"


def test_a_v1alpha1_static_service_with_ports_renders_its_prefixes(render: Render) -> None:
    ssvc = """
apiVersion: stunner.l7mp.io/v1alpha1
kind: StaticService
metadata: {name: media, namespace: stunner}
spec:
  prefixes: [10.11.0.0/16]
  ports: [{port: 5000, protocol: UDP}]
---
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata: {name: r, namespace: stunner}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{group: stunner.l7mp.io, kind: StaticService, name: media}]}]
"""
    cfg = render(HIERARCHY, UDP_GATEWAY, ssvc).configs()["stunner/gw"]
    (cluster,) = cfg.clusters
    assert cluster.endpoints == ("10.11.0.0/16",)  # ports accepted and ignored, as upstream


def test_node_addresses_prefer_the_external_ip_then_the_external_dns_name() -> None:
    nodes = objects_from_yaml(
        """
apiVersion: v1
kind: Node
metadata: {name: a}
status:
  addresses:
  - {type: ExternalDNS, address: a.example.com}
  - {type: ExternalIP, address: 203.0.113.1}
---
apiVersion: v1
kind: Node
metadata: {name: b}
status: {addresses: [{type: ExternalDNS, address: b.example.com}]}
---
apiVersion: v1
kind: Node
metadata: {name: c}
status: {addresses: [{type: InternalIP, address: 10.0.0.3}]}
"""
    )
    assert node_addresses([n for n in nodes if isinstance(n, Node)]) == {
        "a": "203.0.113.1",
        "b": "b.example.com",
    }
