"""The desired per-Gateway Service and Deployment: annotations, ports, types, templates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stunner_operator.render.engine import Renderer
from stunner_operator.render.options import RenderOptions, cds_server_uri
from support.operator import HIERARCHY

Render = Callable[..., Renderer]


def gateway(annotations: str = "{}", labels: str = "{}", listeners: str = "") -> str:
    listeners = listeners or "[{name: udp, port: 3478, protocol: TURN-UDP}]"
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: stunner, annotations: {annotations}, labels: {labels}}}
spec:
  gatewayClassName: stunner
  listeners: {listeners}
"""


def with_lb_annotations(ann: str) -> str:
    return HIERARCHY.replace(
        "spec: {authType", f"spec: {{loadBalancerServiceAnnotations: {ann}, authType"
    )


def service(r: Renderer) -> dict[str, Any]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.service is not None
    return gw.service


def deployment(r: Renderer) -> dict[str, Any]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.deployment is not None
    return gw.deployment


def test_default_service_is_a_load_balancer_with_session_affinity(render: Render) -> None:
    svc = service(render(HIERARCHY, gateway()))
    assert svc["metadata"]["name"] == "gw"
    assert svc["metadata"]["labels"]["stunner.l7mp.io/owned-by"] == "stunner"
    assert svc["metadata"]["annotations"]["stunner.l7mp.io/related-gateway-name"] == "stunner/gw"
    assert svc["metadata"]["ownerReferences"][0]["kind"] == "Gateway"
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["sessionAffinity"] == "ClientIP"
    assert "externalTrafficPolicy" not in svc["spec"]
    assert svc["spec"]["selector"] == {
        "app": "stunner",
        "stunner.l7mp.io/related-gateway-name": "gw",
        "stunner.l7mp.io/related-gateway-namespace": "stunner",
    }
    assert svc["spec"]["ports"] == [{"name": "udp", "protocol": "UDP", "port": 3478}]


@pytest.mark.parametrize(
    ("gwconf", "gw", "expected"),
    [
        ("{}", "{}", "LoadBalancer"),
        ("{stunner.l7mp.io/service-type: ClusterIP}", "{}", "ClusterIP"),
        ("{stunner.l7mp.io/service-type: NodePort}", "{}", "NodePort"),
        ("{}", "{stunner.l7mp.io/service-type: NodePort}", "NodePort"),
        (
            "{stunner.l7mp.io/service-type: NodePort}",
            "{stunner.l7mp.io/service-type: ClusterIP}",
            "ClusterIP",
        ),
        ("{}", "{stunner.l7mp.io/service-type: None}", "LoadBalancer"),
    ],
)
def test_service_type_from_gateway_config_overridden_by_gateway(
    render: Render, gwconf: str, gw: str, expected: str
) -> None:
    assert service(render(with_lb_annotations(gwconf), gateway(gw)))["spec"]["type"] == expected


def test_gateway_annotations_override_gateway_config_ones_and_are_all_copied(
    render: Render,
) -> None:
    svc = service(
        render(
            with_lb_annotations("{a: from-config, b: from-config}"), gateway("{b: from-gw, c: gw}")
        )
    )
    ann = svc["metadata"]["annotations"]
    assert (ann["a"], ann["b"], ann["c"]) == ("from-config", "from-gw", "gw")


@pytest.mark.parametrize(
    ("ann", "policy"),
    [
        ("{stunner.l7mp.io/external-traffic-policy: local}", "Local"),
        ("{stunner.l7mp.io/external-traffic-policy: Local}", "Local"),
        (
            "{stunner.l7mp.io/external-traffic-policy: local,"
            " stunner.l7mp.io/service-type: ClusterIP}",
            None,
        ),
        ("{stunner.l7mp.io/external-traffic-policy: bogus}", None),
    ],
)
def test_external_traffic_policy_only_for_node_port_and_load_balancer(
    render: Render, ann: str, policy: str | None
) -> None:
    assert service(render(HIERARCHY, gateway(ann)))["spec"].get("externalTrafficPolicy") == policy


def test_disable_session_affinity(render: Render) -> None:
    svc = service(render(HIERARCHY, gateway("{stunner.l7mp.io/disable-session-affinity: 'true'}")))
    assert "sessionAffinity" not in svc["spec"]  # Kubernetes' default is None


@pytest.mark.parametrize(
    ("value", "node_port"),
    [
        ("'{\"udp\": 31000}'", 31000),
        ("'\"udp\": 31000'", 31000),  # the brace-less form is accepted
        ("'{\"other\": 31000}'", None),
        ("'not json'", None),
    ],
)
def test_nodeport_annotation_sets_the_node_port_of_named_listeners(
    render: Render, value: str, node_port: int | None
) -> None:
    svc = service(render(HIERARCHY, gateway(f"{{stunner.l7mp.io/nodeport: {value}}}")))
    assert svc["spec"]["ports"][0].get("nodePort") == node_port


def test_existing_node_port_and_target_port_are_retained(render: Render) -> None:
    existing = """
apiVersion: v1
kind: Service
metadata:
  name: gw
  namespace: stunner
  annotations: {stunner.l7mp.io/related-gateway-name: stunner/gw}
spec:
  type: LoadBalancer
  ports: [{name: udp, protocol: UDP, port: 3478, nodePort: 32222, targetPort: 3478}]
"""
    svc = service(render(HIERARCHY, gateway(), existing))
    assert svc["spec"]["ports"][0]["nodePort"] == 32222
    assert svc["spec"]["ports"][0]["targetPort"] == 3478


DO = "service.beta.kubernetes.io/do-loadbalancer-healthcheck"
AWS = "service.beta.kubernetes.io/aws-load-balancer-healthcheck"


def health(prefix: str, port: str, proto: str, extra: str = "") -> str:
    return f"{{{prefix}-port: '{port}', {prefix}-protocol: {proto}{extra}}}"


@pytest.mark.parametrize(
    ("ann", "port"),
    [
        (health(DO, "8086", "http"), 8086),
        (health(AWS, "8080", "TCP"), 8080),
        (health(DO, "x", "http"), None),
        (health(DO, "8086", "udp"), None),
        (health(DO, "8086", "http", ", stunner.l7mp.io/disable-health-check-expose: 'true'"), None),
        (health(DO, "8086", "http", ", stunner.l7mp.io/service-type: NodePort"), None),
    ],
)
def test_health_check_port_is_exposed_on_load_balancers_unless_disabled(
    render: Render, ann: str, port: int | None
) -> None:
    ports = service(render(HIERARCHY, gateway(ann)))["spec"]["ports"]
    health = [p for p in ports if p["name"] == "gateway-health-check"]
    assert [p["port"] for p in health] == ([port] if port else [])
    assert all(p["protocol"] == "TCP" for p in health)


def test_no_valid_listener_means_no_service(render: Render) -> None:
    r = render(HIERARCHY, gateway(listeners="[{name: web, port: 80, protocol: HTTP}]"))
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.service is None


def test_deployment_follows_the_dataplane_template(render: Render) -> None:
    h = HIERARCHY.replace(
        'spec: {image: "stunnerd:test"}',
        "spec: {image: 'stunnerd:test', replicas: 3, args: [-w], env: [{name: X, value: y}],"
        " labels: {team: a}, annotations: {note: b}, hostNetwork: true,"
        " terminationGracePeriodSeconds: 60, disableHealthCheck: true}",
    )
    dep = deployment(render(h, gateway(labels="{tier: edge, app.kubernetes.io/managed-by: helm}")))
    assert dep["spec"]["replicas"] == 3
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"] == {
        "app": "stunner",
        "stunner.l7mp.io/related-gateway-name": "gw",
        "stunner.l7mp.io/related-gateway-namespace": "stunner",
        "team": "a",
    }
    assert pod["metadata"]["annotations"]["note"] == "b"
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["terminationGracePeriodSeconds"] == 60
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "stunner-daemon"
    assert container["image"] == "stunnerd:test"
    assert container["args"] == ["-w"]
    assert "livenessProbe" not in container
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STUNNER_NAME"] == "gw"
    assert env["STUNNER_NAMESPACE"] == "stunner"
    assert env["STUNNER_CONFIG_ORIGIN"] == "http://stunner-config-discovery:13478"
    assert env["X"] == "y"
    labels = dep["metadata"]["labels"]
    assert labels["tier"] == "edge"
    assert "app.kubernetes.io/managed-by" not in labels


def test_deployment_carries_gateway_config_and_gateway_annotations_but_pods_do_not(
    render: Render,
) -> None:
    dep = deployment(render(with_lb_annotations("{a: cfg, b: cfg}"), gateway("{b: gw}")))
    ann = dep["metadata"]["annotations"]
    assert (ann["a"], ann["b"]) == ("cfg", "gw")
    assert ann["stunner.l7mp.io/related-gateway-name"] == "stunner/gw"
    assert dep["spec"]["template"]["metadata"]["annotations"] == {
        "stunner.l7mp.io/related-gateway-name": "stunner/gw"
    }


def test_deployment_defaults_are_those_of_gateway_md(render: Render) -> None:
    dep = deployment(render(HIERARCHY, gateway()))
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # GATEWAY.md gives no default resources: nothing invented. Command and args are upstream's
    # renderer's (a stunnerd that follows the CDS), less its 16 UDP threads.
    assert not {"resources", "envFrom"} & set(container)
    assert (container["command"], container["args"]) == (["stunnerd"], ["-w"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": 8086}
    assert pod["terminationGracePeriodSeconds"] == 30
    assert "hostNetwork" not in pod  # false is Kubernetes' default
    assert "replicas" not in dep["spec"]  # an autoscaler may own it


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("l7mp/stunnerd:latest", "Always"),
        ("l7mp/stunnerd", "Always"),
        ("registry:5000/l7mp/stunnerd", "Always"),
        ("l7mp/stunnerd:1.2.0", "IfNotPresent"),
        ("registry:5000/stunnerd:1.0", "IfNotPresent"),
        ("l7mp/stunnerd@sha256:" + "0" * 64, "IfNotPresent"),
    ],
)
def test_image_pull_policy_defaults_by_tag(render: Render, image: str, policy: str) -> None:
    dp = f"""
apiVersion: stunner.l7mp.io/v1
kind: Dataplane
metadata: {{name: default}}
spec: {{image: "{image}"}}
"""
    (container,) = deployment(render(HIERARCHY, dp, gateway()))["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["imagePullPolicy"] == policy


def test_dataplane_env_from_reaches_the_container(render: Render) -> None:
    dp = """
apiVersion: stunner.l7mp.io/v1
kind: Dataplane
metadata: {name: default}
spec:
  image: l7mp/stunnerd:1.0
  envFrom:
  - configMapRef: {name: stunner-env}
  - secretRef: {name: stunner-secret-env}
    prefix: S_
  terminationGracePeriodSeconds: 3600
"""
    dep = deployment(render(HIERARCHY, dp, gateway()))
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [
        {"configMapRef": {"name": "stunner-env"}},
        {"secretRef": {"name": "stunner-secret-env"}, "prefix": "S_"},
    ]
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 3600


def test_an_offload_engine_gets_the_capabilities_to_load_bpf(
    render: Render,
) -> None:
    h = HIERARCHY.replace(
        'spec: {image: "stunnerd:test"}',
        "spec: {image: 'stunnerd:test', offloadEngine: TC, offloadInterfaces: [eth0],"
        " containerSecurityContext: {runAsUser: 0, capabilities: {add: [NET_ADMIN], drop: [ALL]}}}",
    )
    r = render(h, gateway())
    (container,) = deployment(r)["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"] == {
        "runAsUser": 0,
        "capabilities": {"add": ["BPF", "NET_ADMIN"], "drop": ["ALL"]},
    }
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.config is not None
    assert gw.config.admin.offload_engine == "TC"
    assert gw.config.admin.offload_interfaces == ("eth0",)


def test_without_an_offload_engine_the_pod_gets_no_extra_capability(render: Render) -> None:
    (container,) = deployment(render(HIERARCHY, gateway()))["spec"]["template"]["spec"][
        "containers"
    ]
    assert "securityContext" not in container


def test_cds_address_option_reaches_the_dataplane_pods(render: Render) -> None:
    r = render(HIERARCHY, gateway(), options=RenderOptions(cds_address="10.0.0.9"))
    (container,) = deployment(r)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STUNNER_CONFIG_ORIGIN"] == "http://10.0.0.9:13478"


def test_disable_managed_dataplane_deletes_the_deployment_but_keeps_the_config(
    render: Render,
) -> None:
    r = render(HIERARCHY, gateway("{stunner.l7mp.io/disable-managed-dataplane: 'true'}"))
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.deployment is None
    assert gw.deletes == (("Deployment", "stunner", "gw"),)
    assert gw.service is not None
    assert "stunner/gw" in r.configs()


@pytest.mark.parametrize(
    ("address", "uri"),
    [
        (":13478", "http://:13478"),
        ("cds.example", "http://cds.example:13478"),
        ("1.2.3.4:1000", "http://1.2.3.4:1000"),
        ("::1", "http://[::1]:13478"),
        ("[::1]:8000", "http://[::1]:8000"),
        ("[fe80::1]", "http://[fe80::1]:13478"),
    ],
)
def test_cds_server_uri(address: str, uri: str) -> None:
    assert cds_server_uri(address) == uri


@pytest.mark.parametrize(
    ("spec", "command", "args"),
    [
        ("{image: img:1}", ["stunnerd"], ["-w"]),
        ("{image: img:1, command: [/bin/stunnerd]}", ["/bin/stunnerd"], ["-w"]),
        ("{image: img:1, args: [-w, -u, '2']}", ["stunnerd"], ["-w", "-u", "2"]),
        ("{image: img:1, command: [], args: []}", ["stunnerd"], ["-w"]),
    ],
)
def test_a_dataplane_that_omits_command_or_args_gets_a_watching_stunnerd(
    render: Render, spec: str, command: list[str], args: list[str]
) -> None:
    """Each field defaults on its own, as in upstream's renderer: an empty list is no list."""
    dp = f"""
apiVersion: stunner.l7mp.io/v1
kind: Dataplane
metadata: {{name: default}}
spec: {spec}
"""
    dep = deployment(render(HIERARCHY, dp, gateway()))
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert (container["command"], container["args"]) == (command, args)
