"""Incremental rendering: an event re-renders only what it affects, and the result always equals
a full render of the same objects (checked on long random event sequences)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from stunner_common.crds import K8sObject
from stunner_operator.render.engine import Renderer
from stunner_operator.render.service import echoes_assigned_ports
from stunner_operator.render.store import ObjKey, key_of
from support.operator import HIERARCHY, UDP_GATEWAY, lb_service, objects_from_yaml, snapshot

Render = Callable[..., Renderer]


def gw(name: str, *, cls: str = "stunner", port: int = 3478, allowed: str = "{}") -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: stunner}}
spec:
  gatewayClassName: {cls}
  addresses: [{{value: 1.2.3.4}}]
  listeners: [{{name: l, port: {port}, protocol: TURN-UDP, allowedRoutes: {allowed}}}]
"""


def route(name: str, parents: str, backends: str, ns: str = "stunner") -> str:
    return f"""
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata: {{name: {name}, namespace: {ns}}}
spec: {{parentRefs: {parents}, rules: [{{backendRefs: {backends}}}]}}
"""


def one(text: str) -> K8sObject:
    (obj,) = objects_from_yaml(text)
    return obj


SERVICE = """
apiVersion: v1
kind: Service
metadata: {name: s, namespace: media}
spec: {clusterIP: 10.9.9.9}
"""


def test_an_event_re_renders_only_the_gateways_it_affects(render: Render) -> None:
    r = render(
        HIERARCHY,
        SERVICE,
        *(gw(f"g{i}") for i in range(10)),
        *(route(f"r{i}", f"[{{name: g{i}}}]", "[{name: s, namespace: media}]") for i in range(10)),
    )
    assert len(r.configs()) == 10
    delta = r.apply([one(route("r3", "[{name: g3}]", "[{name: s, namespace: media, port: 9}]"))])
    assert delta.rendered_gateways == 1
    assert list(delta.configs) == ["stunner/g3"]
    # A route that moves from g4 to g5 affects both.
    delta = r.apply([one(route("r4", "[{name: g5}]", "[{name: s, namespace: media}]"))])
    assert delta.rendered_gateways == 2
    assert sorted(delta.configs) == ["stunner/g4", "stunner/g5"]
    # The backend Service changing affects every Gateway whose routes name it (g4 has none now).
    delta = r.apply([one(SERVICE.replace("10.9.9.9", "10.9.9.8"))])
    assert delta.rendered_gateways == 9
    # Something nobody reads re-renders nothing.
    other = SERVICE.replace("name: s,", "name: unrelated,")
    delta = r.apply([one(other)])
    assert delta.rendered_gateways == 0
    assert not delta.configs_changed


def test_deleting_a_gateway_deletes_its_config_at_once(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY)
    delta = r.apply(deletes=[("Gateway", "stunner", "gw")])
    assert delta.deleted == frozenset({"stunner/gw"})
    assert delta.statuses == {("Gateway", "stunner", "gw"): None}
    assert r.configs() == {}


def test_invalidating_the_hierarchy_deletes_the_config_and_restoring_it_brings_it_back(
    render: Render,
) -> None:
    r = render(HIERARCHY, UDP_GATEWAY)
    delta = r.apply(deletes=[("Dataplane", "", "default")])
    assert delta.deleted == frozenset({"stunner/gw"})
    assert ("GatewayClass", "", "stunner") in delta.statuses
    delta = r.apply(objects_from_yaml(HIERARCHY))
    assert list(delta.configs) == ["stunner/gw"]


def test_a_secret_that_appears_later_re_renders_the_gateway_waiting_for_it(render: Render) -> None:
    h = HIERARCHY.replace(
        "spec: {authType: static, userName: user-1, password: pass-1}",
        "spec: {authRef: {name: auth}}",
    )
    r = render(h, UDP_GATEWAY)
    assert r.configs() == {}
    secret = """
apiVersion: v1
kind: Secret
metadata: {name: auth, namespace: stunner}
stringData: {username: a, password: b}
"""
    delta = r.apply([one(secret)])
    assert list(delta.configs) == ["stunner/gw"]


def test_unchanged_input_produces_an_empty_delta(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY)
    delta = r.apply(objects_from_yaml(HIERARCHY + "---\n" + UDP_GATEWAY))
    assert not delta.configs_changed
    assert delta.statuses == {}


# -- random event sequences ------------------------------------------------------------------

NAMESPACE_VARIANTS = [
    "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {app: dev}}",
    "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {app: prod}}",
]
SERVICES = [
    """
apiVersion: v1
kind: Service
metadata: {name: s, namespace: media}
spec: {clusterIP: 10.1.1.1}
""",
    """
apiVersion: v1
kind: Service
metadata: {name: s, namespace: media}
spec: {clusterIP: None}
""",
]
SLICES = [
    f"""
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: s-a, namespace: media, labels: {{kubernetes.io/service-name: {svc}}}}}
endpoints: [{{addresses: [{ip}]}}]
"""
    for svc, ip in (("s", "10.2.0.1"), ("t", "10.2.0.2"))
]
STATICS = [
    f"""
apiVersion: stunner.l7mp.io/v1
kind: StaticService
metadata: {{name: ss, namespace: stunner}}
spec: {{prefixes: [{prefix}]}}
"""
    for prefix in ("10.3.0.0/16", "10.4.0.0/16")
]
V1A2_ROUTE = """
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: UDPRoute
metadata: {name: r1, namespace: stunner}
spec: {parentRefs: [{name: g2}], rules: [{backendRefs: [{name: t, namespace: media, port: 1}]}]}
"""
DATAPLANE, GWCONFIG, GWCLASS = HIERARCHY.split("---")
SELECT_DEV = "{namespaces: {from: Selector, selector: {matchLabels: {app: dev}}}}"
VARIANTS: list[list[str]] = [
    [DATAPLANE],
    [GWCONFIG, GWCONFIG.replace("user-1", "user-2")],
    [GWCLASS, GWCLASS.replace("GatewayConfig, name: gwconfig", "GatewayConfig, name: gone")],
    [GWCLASS.replace("name: stunner}", "name: second}")],
    [gw("g1"), gw("g1", port=3479), gw("g1", cls="second")],
    [gw("g2"), gw("g2", allowed=SELECT_DEV)],
    [gw("g3", cls="second"), gw("g3", allowed="{namespaces: {from: All}}")],
    [
        route("r1", "[{name: g1}]", "[{name: s, namespace: media}]"),
        route("r1", "[{name: g1}, {name: g2}]", "[{name: s, namespace: media, port: 7}]"),
        route("r1", "[{name: g3}]", "[{group: stunner.l7mp.io, kind: StaticService, name: ss}]"),
    ],
    [
        route("r2", "[{name: g2, namespace: stunner}]", "[{name: s, namespace: media}]", ns="team"),
        route("r2", "[{name: g3, namespace: stunner}]", "[{name: t, namespace: media}]", ns="team"),
    ],
    SERVICES,
    SLICES,
    STATICS,
    NAMESPACE_VARIANTS,
    [V1A2_ROUTE],
]


def test_random_event_sequences_match_a_full_render() -> None:
    rng = random.Random(20261121)
    pools = [[one(text) for text in group] for group in VARIANTS]
    for _run in range(30):
        inc = Renderer()
        current: dict[ObjKey, K8sObject] = {}
        for _step in range(40):
            pool = rng.choice(pools)
            key = key_of(pool[0])
            if key in current and rng.random() < 0.3:
                inc.apply(deletes=[key])
                del current[key]
            else:
                obj = rng.choice(pool)
                inc.apply([obj])
                current[key] = obj
            full = Renderer()
            full.apply(list(current.values()))
            assert json.dumps(snapshot(inc), sort_keys=True) == json.dumps(
                snapshot(full), sort_keys=True
            )


ASSIGNED = "[{name: udp, protocol: UDP, port: 3478, nodePort: 31234, targetPort: 3478}]"


def test_the_ports_kubernetes_assigned_are_not_written_back(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY)
    first = r.gateway("stunner", "gw")
    assert first is not None
    assert first.service is not None
    assert "nodePort" not in first.service["spec"]["ports"][0]
    # The watch brings the Service back with the node and target port Kubernetes assigned: the
    # next render keeps them (a later change of the listener's port must not lose the node
    # port), but the Service already has them, so nothing is written.
    delta = r.apply([one(lb_service(ports=ASSIGNED))])
    assert delta.rendered_gateways == 1
    assert delta.services == {}
    kept = r.gateway("stunner", "gw")
    assert kept is not None
    assert kept.service is not None
    assert kept.service["spec"]["ports"][0]["nodePort"] == 31234
    # A real change is written, the node port kept.
    delta = r.apply(objects_from_yaml(UDP_GATEWAY.replace("port: 3478", "port: 3479")))
    (svc,) = delta.services.values()
    assert svc is not None
    assert [(p["port"], p["nodePort"]) for p in svc["spec"]["ports"]] == [(3479, 31234)]


def test_a_gateway_service_deleted_by_hand_is_applied_again(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY)
    assert r.apply([one(lb_service(ports=ASSIGNED))]).services == {}
    delta = r.apply(deletes=[("Service", "stunner", "gw")])
    (svc,) = delta.services.values()
    assert svc is not None
    assert svc["metadata"]["name"] == "gw"
    assert "nodePort" not in svc["spec"]["ports"][0]  # Kubernetes assigns a new one


def test_echoes_assigned_ports_only_for_added_node_and_target_ports() -> None:
    def service(type_: str = "NodePort", **port: int | str) -> dict[str, Any]:
        return {"metadata": {"name": "gw"}, "spec": {"type": type_, "ports": [{"port": 1, **port}]}}

    base = service()
    assert echoes_assigned_ports(base, service(nodePort=30000, targetPort=1))
    assert not echoes_assigned_ports(base, base)  # no change at all
    assert not echoes_assigned_ports(None, base)  # created: written
    assert not echoes_assigned_ports(base, None)  # deleted: written
    assert not echoes_assigned_ports(base, service(protocol="UDP"))
    assert not echoes_assigned_ports(service(nodePort=30000), service(nodePort=30001))
    assert not echoes_assigned_ports(base, service("LoadBalancer", nodePort=3))
