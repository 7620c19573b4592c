"""The operator's DaemonSet and host-network workloads, checked against the Kubernetes models.

Until a real API server takes them (tests/kube), the rendered objects are walked against the
generated `kubernetes_asyncio` models, as the chart's own objects are: field names, types and
required fields of apps/v1 DaemonSet and Deployment.
"""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import validate_builtin

from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, objects_from_yaml

GATEWAY = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
  namespace: stunner
  uid: 0b4c9e52-8f0e-4c43-9d4e-2d1f0c7a1e11
  annotations: {stunner.l7mp.io/enable-relay-address-discovery: "true"}
spec:
  gatewayClassName: stunner
  listeners:
  - {name: udp, port: 3478, protocol: TURN-UDP}
  - {name: tcp, port: 3479, protocol: TURN-TCP}
"""


def rendered(fields: str) -> dict[str, Any]:
    text = HIERARCHY.replace('spec: {image: "stunnerd:test"}', f'spec: {{image: "s:1", {fields}}}')
    renderer = Renderer()
    renderer.apply(objects_from_yaml(text) + objects_from_yaml(GATEWAY))
    gw = renderer.gateway("stunner", "gw")
    assert gw is not None
    assert gw.deployment is not None
    return gw.deployment


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ("dataplaneResource: DaemonSet", "DaemonSet"),
        ("dataplaneResource: DaemonSet, hostNetwork: true", "DaemonSet"),
        ("dataplaneResource: Deployment, hostNetwork: true, replicas: 2", "Deployment"),
    ],
)
def test_rendered_workloads_fit_the_kubernetes_schema(fields: str, kind: str) -> None:
    obj = rendered(fields)
    assert obj["kind"] == kind
    assert validate_builtin(obj) == []
