"""UDPRoutes: attachment (parentRefs, sectionName, allowedRoutes), clusters and route status."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stunner_operator.render.engine import Renderer
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.status import RouteStatus
from support.operator import HIERARCHY, UDP_GATEWAY, conditions

Render = Callable[..., Renderer]


def route(
    name: str = "r",
    ns: str = "stunner",
    *,
    parents: str = "[{name: gw}]",
    backends: str = "[{name: svc, namespace: media}]",
    api: str = "stunner.l7mp.io/v1",
) -> str:
    return f"""
apiVersion: {api}
kind: UDPRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  parentRefs: {parents}
  rules: [{{backendRefs: {backends}}}]
"""


SERVICE = """
apiVersion: v1
kind: Service
metadata: {name: svc, namespace: media}
spec: {clusterIP: 10.96.0.5, ports: [{port: 9, protocol: UDP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: svc-1, namespace: media, labels: {kubernetes.io/service-name: svc}}
endpoints:
- {addresses: [10.0.0.1], conditions: {ready: true}}
- {addresses: [10.0.0.2], conditions: {ready: false, serving: false, terminating: true}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: svc-2, namespace: media, labels: {kubernetes.io/service-name: svc}}
endpoints:
- {addresses: [10.0.0.3]}
"""

STATIC = """
apiVersion: stunner.l7mp.io/v1
kind: StaticService
metadata: {name: ext, namespace: stunner}
spec: {prefixes: [192.0.2.0/24, 198.51.100.1]}
"""


def two_listener_gateway(udp_allowed: str = "{}", tcp_allowed: str = "{}") -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: stunner}}
spec:
  gatewayClassName: stunner
  addresses: [{{value: 1.2.3.4}}]
  listeners:
  - {{name: udp, port: 3478, protocol: TURN-UDP, allowedRoutes: {udp_allowed}}}
  - {{name: tcp, port: 3478, protocol: TURN-TCP, allowedRoutes: {tcp_allowed}}}
"""


def routes_of(r: Renderer) -> dict[str, tuple[str, ...]]:
    return {ls.name.rsplit("/", 1)[1]: ls.routes for ls in r.configs()["stunner/gw"].listeners}


def clusters_of(r: Renderer) -> dict[str, tuple[str, ...]]:
    return {c.name: c.endpoints for c in r.configs()["stunner/gw"].clusters}


def route_status(
    r: Renderer, name: str = "r", ns: str = "stunner", kind: str = "UDPRoute"
) -> RouteStatus:
    status = r.statuses()[(kind, ns, name)]
    assert isinstance(status, RouteStatus)
    return status


def test_service_backend_gives_endpoint_slice_addresses_and_cluster_ip(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, route())
    assert clusters_of(r) == {"stunner/r": ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.96.0.5")}
    assert routes_of(r) == {"udp": ("stunner/r",)}
    (parent,) = route_status(r).parents
    assert conditions(parent) == {
        "Accepted": ("True", "Accepted"),
        "ResolvedRefs": ("True", "ResolvedRefs"),
    }


def test_relay_to_cluster_ip_can_be_switched_off(render: Render) -> None:
    r = render(
        HIERARCHY, UDP_GATEWAY, SERVICE, route(), options=RenderOptions(relay_to_cluster_ip=False)
    )
    assert clusters_of(r) == {"stunner/r": ("10.0.0.1", "10.0.0.2", "10.0.0.3")}


def test_without_endpoint_discovery_the_cluster_is_strict_dns(render: Render) -> None:
    r = render(
        HIERARCHY, UDP_GATEWAY, SERVICE, route(), options=RenderOptions(endpoint_discovery=False)
    )
    (cluster,) = r.configs()["stunner/gw"].clusters
    assert cluster.type == "STRICT_DNS"
    assert cluster.endpoints == ("svc.media.svc.cluster.local",)


@pytest.mark.parametrize(
    ("ports", "suffix"),
    [
        ("port: 5000", ":<5000-5000>"),
        ("port: 5000, endPort: 6000", ":<5000-6000>"),
        ("port: 1, endPort: 65535", ""),
    ],
)
def test_backend_port_ranges_narrow_every_endpoint_of_that_backend(
    render: Render, ports: str, suffix: str
) -> None:
    backends = (
        f"[{{name: svc, namespace: media, {ports}}},"
        " {group: stunner.l7mp.io, kind: StaticService, name: ext}]"
    )
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, STATIC, route(backends=backends))
    assert clusters_of(r)["stunner/r"] == tuple(
        sorted(
            [f"10.0.0.{i}{suffix}" for i in (1, 2, 3)]
            + [f"10.96.0.5{suffix}", "192.0.2.0/24", "198.51.100.1"]
        )
    )


def test_v1alpha2_route_backend_port_is_ignored(render: Render) -> None:
    backends = "[{name: svc, namespace: media, port: 5000}]"
    r = render(
        HIERARCHY,
        UDP_GATEWAY,
        SERVICE,
        route(backends=backends, api="gateway.networking.k8s.io/v1alpha2"),
    )
    assert clusters_of(r)["stunner/r"] == ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.96.0.5")


def test_static_service_backend_copies_its_prefixes(render: Render) -> None:
    backends = "[{group: stunner.l7mp.io, kind: StaticService, name: ext}]"
    r = render(HIERARCHY, UDP_GATEWAY, STATIC, route(backends=backends))
    assert clusters_of(r) == {"stunner/r": ("192.0.2.0/24", "198.51.100.1")}


def test_missing_backends_are_reported_and_the_rest_still_renders(render: Render) -> None:
    backends = (
        "[{name: svc, namespace: media}, {name: gone, namespace: media},"
        " {group: stunner.l7mp.io, kind: StaticService, name: nope}]"
    )
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, route(backends=backends))
    assert clusters_of(r)["stunner/r"] == ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.96.0.5")
    (parent,) = route_status(r).parents
    resolved = parent.condition("ResolvedRefs")
    assert resolved is not None
    assert (resolved.status, resolved.reason) == ("False", "BackendNotFound")
    assert "Service media/gone not found" in resolved.message
    assert "StaticService stunner/nope not found" in resolved.message


def test_headless_service_keeps_its_pod_addresses_but_reports_the_backend(render: Render) -> None:
    r = render(
        HIERARCHY, UDP_GATEWAY, SERVICE.replace("clusterIP: 10.96.0.5", "clusterIP: None"), route()
    )
    assert clusters_of(r)["stunner/r"] == ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    (parent,) = route_status(r).parents
    assert conditions(parent)["ResolvedRefs"] == ("False", "BackendNotFound")


@pytest.mark.parametrize(
    "backend",
    ["{group: example.com, name: x}", "{kind: Pod, name: x}", "{kind: StaticService, name: ext}"],
)
def test_backend_of_wrong_group_or_kind_is_skipped_with_invalid_kind(
    render: Render, backend: str
) -> None:
    r = render(HIERARCHY, UDP_GATEWAY, STATIC, route(backends=f"[{backend}]"))
    assert clusters_of(r) == {"stunner/r": ()}
    (parent,) = route_status(r).parents
    assert conditions(parent)["ResolvedRefs"] == ("False", "InvalidKind")


def test_invalid_static_prefix_is_dropped_and_reported(render: Render) -> None:
    bad = STATIC.replace("198.51.100.1]", "not-an-ip]")
    backends = "[{group: stunner.l7mp.io, kind: StaticService, name: ext}]"
    r = render(HIERARCHY, UDP_GATEWAY, bad, route(backends=backends))
    assert clusters_of(r) == {"stunner/r": ("192.0.2.0/24",)}
    (parent,) = route_status(r).parents
    resolved = parent.condition("ResolvedRefs")
    assert resolved is not None
    assert "invalid address 'not-an-ip'" in resolved.message


def test_mixing_strict_dns_and_static_backends_skips_the_later_one(render: Render) -> None:
    backends = (
        "[{name: svc, namespace: media}, {group: stunner.l7mp.io, kind: StaticService, name: ext}]"
    )
    r = render(
        HIERARCHY,
        UDP_GATEWAY,
        SERVICE,
        STATIC,
        route(backends=backends),
        options=RenderOptions(endpoint_discovery=False),
    )
    assert clusters_of(r) == {"stunner/r": ("svc.media.svc.cluster.local",)}
    (parent,) = route_status(r).parents
    assert conditions(parent)["ResolvedRefs"][0] == "False"


def test_route_without_section_name_attaches_to_every_listener(render: Render) -> None:
    r = render(HIERARCHY, two_listener_gateway(), SERVICE, route())
    assert routes_of(r) == {"udp": ("stunner/r",), "tcp": ("stunner/r",)}


def test_section_name_picks_one_listener(render: Render) -> None:
    r = render(
        HIERARCHY, two_listener_gateway(), SERVICE, route(parents="[{name: gw, sectionName: tcp}]")
    )
    assert routes_of(r) == {"udp": (), "tcp": ("stunner/r",)}
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    assert [ls.attached_routes for ls in gw.status.listeners] == [0, 1]


def test_unknown_section_name_is_not_accepted(render: Render) -> None:
    r = render(
        HIERARCHY, two_listener_gateway(), SERVICE, route(parents="[{name: gw, sectionName: nope}]")
    )
    assert clusters_of(r) == {}
    (parent,) = route_status(r).parents
    accepted = parent.condition("Accepted")
    assert accepted is not None
    assert (accepted.status, accepted.reason) == ("False", "NotAllowedByListeners")
    assert "has no listener named 'nope'" in accepted.message


def test_missing_parent_gateway_is_reported_next_to_an_existing_one(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, route(parents="[{name: gw}, {name: ghost}]"))
    parents = route_status(r).parents
    assert [conditions(p)["Accepted"] for p in parents] == [
        ("True", "Accepted"),
        ("False", "NoMatchingParent"),
    ]


def test_route_attached_to_no_gateway_of_ours_gets_no_status(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, route(parents="[{name: ghost}]"))
    assert ("UDPRoute", "stunner", "r") not in r.statuses()


def test_cross_namespace_route_needs_allowed_routes_all_or_selector(render: Render) -> None:
    other = route(ns="team", parents="[{name: gw, namespace: stunner}]")
    r = render(HIERARCHY, two_listener_gateway(), SERVICE, other)
    assert "stunner/gw" in r.configs()
    assert clusters_of(r) == {}
    (parent,) = route_status(r, ns="team").parents
    accepted = parent.condition("Accepted")
    assert accepted is not None
    assert accepted.reason == "NotAllowedByListeners"
    assert "namespace 'team'" in accepted.message

    r = render(
        HIERARCHY, two_listener_gateway(udp_allowed="{namespaces: {from: All}}"), SERVICE, other
    )
    assert routes_of(r) == {"udp": ("team/r",), "tcp": ()}
    assert conditions(route_status(r, ns="team").parents[0])["Accepted"] == ("True", "Accepted")


def test_selector_policy_matches_namespace_labels(render: Render) -> None:
    ns = """
apiVersion: v1
kind: Namespace
metadata: {name: team, labels: {app: dev}}
"""
    selector = "{namespaces: {from: Selector, selector: {matchLabels: {app: dev}}}}"
    other = route(ns="team", parents="[{name: gw, namespace: stunner}]")
    r = render(HIERARCHY, two_listener_gateway(tcp_allowed=selector), SERVICE, other, ns)
    assert routes_of(r) == {"udp": (), "tcp": ("team/r",)}
    r = render(HIERARCHY, two_listener_gateway(tcp_allowed=selector), SERVICE, other)
    assert routes_of(r) == {"udp": (), "tcp": ()}


def test_selector_can_use_the_implicit_namespace_name_label(render: Render) -> None:
    selector = (
        "{namespaces: {from: Selector, selector: {matchExpressions:"
        " [{key: kubernetes.io/metadata.name, operator: In, values: [team]}]}}}"
    )
    other = route(ns="team", parents="[{name: gw, namespace: stunner}]")
    r = render(HIERARCHY, two_listener_gateway(udp_allowed=selector), SERVICE, other)
    assert routes_of(r) == {"udp": ("team/r",), "tcp": ()}


def test_selector_without_selector_admits_nothing(render: Render) -> None:
    other = route(ns="team", parents="[{name: gw, namespace: stunner}]")
    r = render(
        HIERARCHY,
        two_listener_gateway(udp_allowed="{namespaces: {from: Selector}}"),
        SERVICE,
        other,
    )
    assert routes_of(r) == {"udp": (), "tcp": ()}


def test_v1alpha2_route_is_masked_by_a_stunner_route_of_the_same_name(render: Render) -> None:
    v1 = route(backends="[{name: svc, namespace: media}]")
    v1a2 = route(
        backends="[{name: other, namespace: media, port: 1}]",
        api="gateway.networking.k8s.io/v1alpha2",
    )
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, v1, v1a2)
    assert clusters_of(r) == {"stunner/r": ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.96.0.5")}
    masked = route_status(r, kind="UDPRouteV1A2")
    assert conditions(masked.parents[0])["Accepted"] == ("False", "Pending")


def test_routes_and_clusters_are_sorted(render: Render) -> None:
    routes = [
        route(name=n, backends="[{name: svc, namespace: media}]") for n in ("zeta", "alpha", "mid")
    ]
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, *routes)
    cfg = r.configs()["stunner/gw"]
    assert cfg.listeners[0].routes == ("stunner/alpha", "stunner/mid", "stunner/zeta")
    assert [c.name for c in cfg.clusters] == ["stunner/alpha", "stunner/mid", "stunner/zeta"]


def test_route_to_a_foreign_gateway_is_not_rendered_into_ours(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, route(parents="[{name: other-gw}]"))
    assert clusters_of(r) == {}
