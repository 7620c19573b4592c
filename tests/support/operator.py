"""Helpers of the operator unit tests: build objects from YAML, snapshot a render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from stunner_common.crds import K8sObject, parse_object
from stunner_operator.render.engine import Renderer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "operator"


def objects_from_yaml(text: str) -> list[K8sObject]:
    return [parse_object(doc) for doc in yaml.safe_load_all(text) if doc]


def snapshot(renderer: Renderer) -> dict[str, Any]:
    """Everything a render produced, as plain JSON-able data keyed by readable names."""
    statuses = {}
    for key, status in sorted(renderer.statuses().items()):
        label = f"{key[0]} {key[1]}/{key[2]}" if key[1] else f"{key[0]} {key[2]}"
        statuses[label] = status.to_k8s()
    services = {}
    deployments = {}
    for render in renderer.gateway_renders():
        if render.service is not None:
            services[render.config_id] = render.service
        if render.deployment is not None:
            deployments[render.config_id] = render.deployment
    return {
        "configs": {
            cid: json.loads(cfg.canonical_json()) for cid, cfg in sorted(renderer.configs().items())
        },
        "statuses": statuses,
        "services": services,
        "deployments": deployments,
    }


HIERARCHY = """
apiVersion: stunner.l7mp.io/v1
kind: Dataplane
metadata: {name: default}
spec: {image: "stunnerd:test"}
---
apiVersion: stunner.l7mp.io/v1
kind: GatewayConfig
metadata: {name: gwconfig, namespace: stunner}
spec: {authType: static, userName: user-1, password: pass-1}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: stunner}
spec:
  controllerName: stunner.l7mp.io/gateway-operator
  parametersRef: {group: stunner.l7mp.io, kind: GatewayConfig, name: gwconfig, namespace: stunner}
"""
"""Class ``stunner`` -> GatewayConfig stunner/gwconfig (static user-1/pass-1) -> Dataplane."""

UDP_GATEWAY = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: stunner}
spec:
  gatewayClassName: stunner
  addresses: [{type: IPAddress, value: 1.2.3.4}]
  listeners:
  - {name: udp, port: 3478, protocol: TURN-UDP}
"""
"""Gateway stunner/gw with one TURN-UDP listener, advertised on 1.2.3.4."""


def doc(**fields: Any) -> str:
    """One YAML document from keyword fields (``api_version`` becomes ``apiVersion``)."""
    body = {("apiVersion" if k == "api_version" else k): v for k, v in fields.items()}
    return yaml.safe_dump(body, sort_keys=False)


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    """``{type: (status, reason)}`` of a status object or entry that has conditions."""
    return {c.type: (c.status, c.reason) for c in status.conditions}


def lb_service(
    *, type_: str = "LoadBalancer", ports: str, ingress: str = "[]", owner_uid: str = "u-1"
) -> str:
    """The Service the operator made for stunner/gw (UDP_GATEWAY) as the API server hands it
    back: its ``ports`` and load-balancer ``ingress`` as YAML flow text."""
    return f"""
apiVersion: v1
kind: Service
metadata:
  name: gw
  namespace: stunner
  annotations: {{stunner.l7mp.io/related-gateway-name: stunner/gw}}
  ownerReferences:
  - {{apiVersion: gateway.networking.k8s.io/v1, kind: Gateway, name: gw, uid: {owner_uid}}}
spec: {{type: {type_}, ports: {ports}}}
status: {{loadBalancer: {{ingress: {ingress}}}}}
"""
