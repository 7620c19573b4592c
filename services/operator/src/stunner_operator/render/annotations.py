"""The labels and ``stunner.l7mp.io/*`` annotations of the objects a Gateway renders to.

Every annotation of GATEWAY.md is read here, from the GatewayConfig's
``loadBalancerServiceAnnotations`` overridden by the Gateway's own annotations; a malformed one is
ignored with a problem that the Gateway's status names. The Service (``service``) and the
Deployment (``dataplane``) share the labels and the owner reference.
"""

from __future__ import annotations

from typing import Any

from stunner_common.contracts.listener_port import TARGETPORT_ANNOTATION, parse_port_map
from stunner_common.crds import Gateway, GatewayConfig
from stunner_operator.render.families import ip_family_problems

OWNED_BY_LABEL = "stunner.l7mp.io/owned-by"
OWNED_BY_VALUE = "stunner"
RELATED_GATEWAY_NAME = "stunner.l7mp.io/related-gateway-name"
RELATED_GATEWAY_NAMESPACE = "stunner.l7mp.io/related-gateway-namespace"
APP_LABEL = "app"
APP_VALUE = "stunner"

SERVICE_TYPE = "stunner.l7mp.io/service-type"
MIXED_PROTOCOL = "stunner.l7mp.io/enable-mixed-protocol-lb"
EXTERNAL_TRAFFIC_POLICY = "stunner.l7mp.io/external-traffic-policy"
DISABLE_MANAGED_DATAPLANE = "stunner.l7mp.io/disable-managed-dataplane"
NODEPORT = "stunner.l7mp.io/nodeport"
DISABLE_HEALTH_CHECK_EXPOSE = "stunner.l7mp.io/disable-health-check-expose"
DISABLE_SESSION_AFFINITY = "stunner.l7mp.io/disable-session-affinity"
RELAY_ADDRESS_DISCOVERY = "stunner.l7mp.io/enable-relay-address-discovery"

SERVICE_TYPES = ("ClusterIP", "NodePort", "ExternalName", "LoadBalancer")


def is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


def merged_annotations(gw: Gateway, gwconfig: GatewayConfig) -> dict[str, str]:
    """GatewayConfig LB annotations overridden by the Gateway's annotations."""
    out = dict(gwconfig.spec.load_balancer_service_annotations)
    out.update(gw.metadata.annotations)
    return out


def port_map(annotations: dict[str, str], key: str) -> dict[str, int]:
    """The valid entries of a nodeport annotation (``contracts.listener_port.parse_port_map``)."""
    return parse_port_map(annotations, key)[0]


_BOOLEAN_ANNOTATIONS = (
    MIXED_PROTOCOL,
    DISABLE_MANAGED_DATAPLANE,
    DISABLE_HEALTH_CHECK_EXPOSE,
    DISABLE_SESSION_AFFINITY,
    RELAY_ADDRESS_DISCOVERY,
)


def annotation_problems(annotations: dict[str, str], listener_names: list[str]) -> list[str]:
    """What is wrong with the ``stunner.l7mp.io/*`` annotations: each is ignored, not fatal."""
    problems: list[str] = []
    kind = annotations.get(SERVICE_TYPE)
    if kind is not None and kind not in SERVICE_TYPES:
        problems.append(
            f"annotation {SERVICE_TYPE}: {kind!r} is not one of {', '.join(SERVICE_TYPES)}; "
            "using LoadBalancer"
        )
    for key in (NODEPORT, TARGETPORT_ANNOTATION):
        ports, bad = parse_port_map(annotations, key)
        problems.extend(bad)
        problems.extend(
            f"annotation {key}: the Gateway has no listener {name!r}"
            for name in ports
            if name not in listener_names
        )
    for key in _BOOLEAN_ANNOTATIONS:
        value = annotations.get(key)
        if value is not None and value.strip().lower() not in ("true", "false"):
            problems.append(f"annotation {key}: {value!r} is not true or false; read as false")
    policy = annotations.get(EXTERNAL_TRAFFIC_POLICY)
    if policy is not None and policy.strip().lower() not in ("local", "cluster"):
        problems.append(
            f"annotation {EXTERNAL_TRAFFIC_POLICY}: {policy!r} is not Local or Cluster; ignored"
        )
    problems.extend(ip_family_problems(annotations))
    return problems


def service_type(annotations: dict[str, str]) -> str:
    value = annotations.get(SERVICE_TYPE, "")
    return value if value in SERVICE_TYPES else "LoadBalancer"


def owner_reference(gw: Gateway) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "name": gw.metadata.name,
    }
    if gw.metadata.uid:
        ref["uid"] = gw.metadata.uid
    return ref
