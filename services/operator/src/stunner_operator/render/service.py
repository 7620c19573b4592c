"""The per-Gateway LoadBalancer Service, as a manifest (https://github.com/l7mp/stunner/blob/main/docs/GATEWAY.md).

The renderer only computes what the Service should look like: the cluster controller applies it,
merging with fields owned by others. Without the mixed-protocol annotation it exposes the
listeners of the first valid listener's protocol only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stunner_common.contracts.listener_port import TargetPorts
from stunner_common.crds import Gateway, Listener, Service
from stunner_operator.render.annotations import (
    APP_LABEL,
    APP_VALUE,
    DISABLE_HEALTH_CHECK_EXPOSE,
    DISABLE_SESSION_AFFINITY,
    EXTERNAL_TRAFFIC_POLICY,
    MIXED_PROTOCOL,
    NODEPORT,
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
    is_true,
    owner_reference,
    port_map,
    service_type,
)
from stunner_operator.render.families import address_family, hinted_ips, ip_families

HEALTH_CHECK_PORT_NAME = "gateway-health-check"
_HEALTH_PORT_RE = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*port$")
_HEALTH_PROTO_RE = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*protocol$")


@dataclass(frozen=True, slots=True)
class ExposedListener:
    """A listener the Service may expose: its spec and its Service protocol (UDP or TCP)."""

    listener: Listener
    service_protocol: str


def exposed_listeners(
    candidates: list[ExposedListener], annotations: dict[str, str]
) -> list[ExposedListener]:
    """Without the mixed-protocol annotation only the first valid listener's protocol is exposed."""
    if not candidates or is_true(annotations.get(MIXED_PROTOCOL)):
        return list(candidates)
    proto = candidates[0].service_protocol
    return [c for c in candidates if c.service_protocol == proto]


def _health_check_port(annotations: dict[str, str]) -> int | None:
    if is_true(annotations.get(DISABLE_HEALTH_CHECK_EXPOSE)):
        return None
    port = next((v for k, v in sorted(annotations.items()) if _HEALTH_PORT_RE.match(k)), None)
    proto = next((v for k, v in sorted(annotations.items()) if _HEALTH_PROTO_RE.match(k)), None)
    if port is None or proto is None or proto.strip().upper() not in ("TCP", "HTTP"):
        return None
    try:
        value = int(port)
    except ValueError:
        return None
    return value if 1 <= value <= 65535 else None


def render_service(
    gw: Gateway,
    exposed: list[ExposedListener],
    annotations: dict[str, str],
    existing: Service | None,
    targetports: TargetPorts,
) -> dict[str, Any] | None:
    """The desired LB Service of ``gw``, or None when no listener can be exposed.

    ``targetports`` is the targetport annotation of ``annotations``, decoded once per render."""
    if not exposed:
        return None
    ns, name = gw.metadata.namespace, gw.metadata.name
    svc_type = service_type(annotations)
    ports = _service_ports(exposed, annotations, existing, targetports)
    if svc_type == "LoadBalancer" and (hc := _health_check_port(annotations)) is not None:
        ports.append({"name": HEALTH_CHECK_PORT_NAME, "protocol": "TCP", "port": hc})
    spec: dict[str, Any] = {
        "type": svc_type,
        "selector": {
            APP_LABEL: APP_VALUE,
            RELATED_GATEWAY_NAME: name,
            RELATED_GATEWAY_NAMESPACE: ns,
        },
        "ports": ports,
    }
    if not is_true(annotations.get(DISABLE_SESSION_AFFINITY)):
        spec["sessionAffinity"] = "ClientIP"  # disabled: Kubernetes' default, None
    if annotations.get(EXTERNAL_TRAFFIC_POLICY, "").strip().lower() == "local" and svc_type in (
        "NodePort",
        "LoadBalancer",
    ):
        spec["externalTrafficPolicy"] = "Local"
    spec.update(_addresses(gw, annotations))
    svc_annotations = dict(annotations)
    svc_annotations[RELATED_GATEWAY_NAME] = f"{ns}/{name}"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {
                OWNED_BY_LABEL: OWNED_BY_VALUE,
                RELATED_GATEWAY_NAME: name,
                RELATED_GATEWAY_NAMESPACE: ns,
            },
            "annotations": dict(sorted(svc_annotations.items())),
            "ownerReferences": [owner_reference(gw)],
        },
        "spec": spec,
    }


def _service_ports(
    exposed: list[ExposedListener],
    annotations: dict[str, str],
    existing: Service | None,
    targetports: TargetPorts,
) -> list[dict[str, Any]]:
    """One port per exposed listener; its target and node ports from the annotations, else
    kept from the Service as it stands (Kubernetes assigned them)."""
    nodeports = port_map(annotations, NODEPORT)
    old_ports = {p.name: p for p in existing.spec.ports} if existing is not None else {}
    ports: list[dict[str, Any]] = []
    for item in exposed:
        ls = item.listener
        port: dict[str, Any] = {"name": ls.name, "protocol": item.service_protocol, "port": ls.port}
        old = old_ports.get(ls.name)
        if (target := targetports.get(ls.name)) is not None:
            port["targetPort"] = target
        elif old is not None and old.target_port is not None:
            port["targetPort"] = old.target_port
        if ls.name in nodeports:
            port["nodePort"] = nodeports[ls.name]
        elif old is not None and old.node_port:
            port["nodePort"] = old.node_port
        ports.append(port)
    return ports


def _addresses(gw: Gateway, annotations: dict[str, str]) -> dict[str, Any]:
    """The Service's address fields: the Gateway's hinted address, its IP families."""
    spec: dict[str, Any] = {}
    if gw.spec.addresses:
        addr = gw.spec.addresses[0]
        if (addr.type or "IPAddress") == "IPAddress" and addr.value:
            spec["loadBalancerIP"] = addr.value
            spec["externalIPs"] = [addr.value]
    families = ip_families(gw, annotations)
    if families.policy is not None:
        spec["ipFamilyPolicy"] = families.policy
    if families.families:
        spec["ipFamilies"] = list(families.families)
    if families.dual_stack and "externalIPs" in spec:
        # the first hinted address of the other family too (GATEWAY.md uses only the first)
        first = address_family(spec["externalIPs"][0])
        other = next((ip for ip in hinted_ips(gw) if address_family(ip) != first), None)
        if other is not None:
            spec["externalIPs"].append(other)
    return spec


ASSIGNED_PORT_FIELDS = ("nodePort", "targetPort")


def echoes_assigned_ports(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether ``new`` differs from ``old`` only by node and target ports that ``old`` left
    unset and ``new`` keeps from the Service as it stands (`_service_ports`): the values
    Kubernetes assigned when the first manifest was applied. The Service already has them, so
    applying ``new`` would write nothing but a second request per Gateway."""
    if old is None or new is None:
        return False
    old_ports = list(old.get("spec", {}).get("ports", ()))
    new_ports = list(new.get("spec", {}).get("ports", ()))
    if len(old_ports) != len(new_ports):
        return False
    if {**old, "spec": {**old["spec"], "ports": []}} != {
        **new,
        "spec": {**new["spec"], "ports": []},
    }:
        return False
    for was, now in zip(old_ports, new_ports, strict=True):
        added = {k: v for k, v in now.items() if k not in was}
        if set(added) - set(ASSIGNED_PORT_FIELDS) or any(now.get(k) != v for k, v in was.items()):
            return False
    return old_ports != new_ports
