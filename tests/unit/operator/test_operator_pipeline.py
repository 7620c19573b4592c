"""End-to-end renders ported from upstream's managed-mode pipeline tests."""

from __future__ import annotations

from collections.abc import Callable

from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, conditions

Render = Callable[..., Renderer]

# Upstream's shared fixtures: two listeners, a route with a sectionName, EndpointSlice addresses
# 1.2.3.4/.5 (ready), .6 (terminating) and .7 (serving only), a LoadBalancer Service at 1.2.3.4.
GATEWAY_1 = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gateway-1, namespace: testnamespace, uid: gw-1}
spec:
  gatewayClassName: stunner
  listeners:
  - {name: gateway-1-listener-udp, port: 1, protocol: TURN-UDP}
  - {name: gateway-1-listener-tcp, port: 2, protocol: TURN-TCP}
"""
ROUTE_OK = """
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata: {name: udproute-ok, namespace: testnamespace}
spec:
  parentRefs: [{name: gateway-1, sectionName: gateway-1-listener-udp}]
  rules: [{backendRefs: [{name: testservice-ok, namespace: testnamespace}]}]
"""
BACKEND = """
apiVersion: v1
kind: Service
metadata: {name: testservice-ok, namespace: testnamespace}
spec: {clusterIP: 4.3.2.1, ports: [{port: 1, protocol: UDP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: testendpointslice-ok
  namespace: testnamespace
  labels: {kubernetes.io/service-name: testservice-ok}
endpoints:
- {addresses: [1.2.3.4], conditions: {ready: true}}
- {addresses: [1.2.3.5], conditions: {ready: true}}
- {addresses: [1.2.3.6], conditions: {ready: false, terminating: true}}
- {addresses: [1.2.3.7], conditions: {ready: false, serving: true}}
"""
LB = """
apiVersion: v1
kind: Service
metadata:
  name: gateway-1
  namespace: testnamespace
  annotations: {stunner.l7mp.io/related-gateway-name: testnamespace/gateway-1}
  ownerReferences:
  - {apiVersion: gateway.networking.k8s.io/v1, kind: Gateway, name: gateway-1, uid: gw-1}
spec:
  type: LoadBalancer
  ports:
  - {name: gateway-1-listener-udp, protocol: UDP, port: 1}
  - {name: gateway-1-listener-tcp, protocol: TCP, port: 2}
status:
  loadBalancer:
    ingress:
    - ip: 1.2.3.4
      ports: [{port: 1, protocol: UDP}, {port: 2, protocol: TCP}]
"""


def test_eds_with_relay_to_cluster_ip_e2e(render: Render) -> None:
    r = render(HIERARCHY, GATEWAY_1, ROUTE_OK, BACKEND, LB)
    cfg = r.configs()["testnamespace/gateway-1"]
    (cluster,) = cfg.clusters
    assert cluster.name == "testnamespace/udproute-ok"
    assert cluster.endpoints == ("1.2.3.4", "1.2.3.5", "1.2.3.6", "1.2.3.7", "4.3.2.1")
    udp = cfg.listener("testnamespace/gateway-1/gateway-1-listener-udp")
    tcp = cfg.listener("testnamespace/gateway-1/gateway-1-listener-tcp")
    assert udp is not None
    assert tcp is not None
    assert udp.routes == ("testnamespace/udproute-ok",)
    assert tcp.routes == ()
    # Without the mixed-protocol annotation only the UDP listener is exposed.
    assert (udp.public_address, udp.public_port) == ("1.2.3.4", 1)
    assert (tcp.public_address, tcp.public_port) == ("", 0)
    gw = r.gateway("testnamespace", "gateway-1")
    assert gw is not None
    assert gw.status is not None
    assert conditions(gw.status)["Programmed"] == ("False", "AddressNotAssigned")


def test_no_eds_e2e_renders_a_strict_dns_cluster(render: Render) -> None:
    from stunner_operator.render.options import RenderOptions

    r = render(
        HIERARCHY, GATEWAY_1, ROUTE_OK, BACKEND, options=RenderOptions(endpoint_discovery=False)
    )
    (cluster,) = r.configs()["testnamespace/gateway-1"].clusters
    assert (cluster.type, cluster.endpoints) == (
        "STRICT_DNS",
        ("testservice-ok.testnamespace.svc.cluster.local",),
    )


def test_service_with_eds_plus_static_service(render: Render) -> None:
    static = """
apiVersion: stunner.l7mp.io/v1
kind: StaticService
metadata: {name: teststaticservice-ok, namespace: testnamespace}
spec: {prefixes: [10.11.12.13, 10.11.12.14, 10.11.12.15]}
"""
    route = ROUTE_OK.replace(
        "[{name: testservice-ok, namespace: testnamespace}]",
        "[{name: testservice-ok, namespace: testnamespace},"
        " {group: stunner.l7mp.io, kind: StaticService, name: teststaticservice-ok}]",
    )
    r = render(HIERARCHY, GATEWAY_1, route, BACKEND, static)
    (cluster,) = r.configs()["testnamespace/gateway-1"].clusters
    assert len(cluster.endpoints) == 8


def test_conflicted_listeners_status(render: Render) -> None:
    listeners = "\n".join(
        f"  - {{name: l{i}, port: {3478 + i // 2}, protocol: {p}}}"
        for i, p in enumerate(
            ["TURN-UDP", "TURN-DTLS", "TURN-TCP", "TURN-TLS", "UDP", "TCP", "TURN-UDP", "TURN-UDP"]
        )
    )
    gw = f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: stunner}}
spec:
  gatewayClassName: stunner
  listeners:
{listeners}
"""
    r = render(HIERARCHY, gw)
    render_ = r.gateway("stunner", "gw")
    assert render_ is not None
    assert render_.status is not None
    by_name = {ls.name: conditions(ls) for ls in render_.status.listeners}
    # Ports: l0,l1 -> 3478; l2,l3 -> 3479; l4,l5 -> 3480; l6,l7 -> 3481.
    assert by_name["l1"]["Conflicted"] == ("True", "ProtocolConflict")  # DTLS after UDP on 3478
    assert by_name["l7"]["Conflicted"] == ("True", "PortConflict")  # UDP after UDP on 3481
    assert by_name["l3"]["Conflicted"] == ("True", "ProtocolConflict")  # TLS after TCP on 3479
    assert by_name["l4"]["Conflicted"] == ("False", "NoConflicts")
    assert by_name["l5"]["Conflicted"] == ("False", "NoConflicts")
    cfg_names = sorted(ls.name.rsplit("/", 1)[1] for ls in r.configs()["stunner/gw"].listeners)
    assert cfg_names == ["l0", "l2", "l4", "l5", "l6"]


def test_multiple_gateway_classes_give_per_gateway_configs(render: Render) -> None:
    second = """
apiVersion: stunner.l7mp.io/v1
kind: GatewayConfig
metadata: {name: gwconfig-2, namespace: stunner}
spec: {realm: realm-2, authType: ephemeral, sharedSecret: s2}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: class-2}
spec:
  controllerName: stunner.l7mp.io/gateway-operator
  parametersRef: {group: stunner.l7mp.io, kind: GatewayConfig, name: gwconfig-2, namespace: stunner}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gateway-2, namespace: testnamespace}
spec:
  gatewayClassName: class-2
  listeners: [{name: udp, port: 3478, protocol: TURN-UDP}]
---
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata: {name: route-2, namespace: testnamespace}
spec:
  parentRefs: [{name: gateway-2}]
  rules: [{backendRefs: [{name: testservice-ok, port: 10, endPort: 100}]}]
"""
    r = render(HIERARCHY, GATEWAY_1, ROUTE_OK, BACKEND, second)
    configs = r.configs()
    assert sorted(configs) == ["testnamespace/gateway-1", "testnamespace/gateway-2"]
    one, two = configs["testnamespace/gateway-1"], configs["testnamespace/gateway-2"]
    assert (one.auth.type, one.auth.realm) == ("static", "stunner.l7mp.io")
    assert (two.auth.type, two.auth.realm, two.auth.credentials) == (
        "ephemeral",
        "realm-2",
        {"secret": "s2"},
    )
    (cluster,) = two.clusters
    assert cluster.endpoints == tuple(
        sorted(f"{ip}:<10-100>" for ip in ("1.2.3.4", "1.2.3.5", "1.2.3.6", "1.2.3.7", "4.3.2.1"))
    )
    assert [c.name for c in one.clusters] == ["testnamespace/udproute-ok"]


def test_targetport_enforced_with_public_ports_from_the_service(render: Render) -> None:
    gw = GATEWAY_1.replace(
        "uid: gw-1}",
        "uid: gw-1, annotations: {stunner.l7mp.io/enable-mixed-protocol-lb: 'true',"
        ' stunner.l7mp.io/targetport: \'{"gateway-1-listener-udp": 11,'
        ' "gateway-1-listener-tcp": 13}\'}}',
    )
    r = render(HIERARCHY, gw, ROUTE_OK, BACKEND, LB)
    cfg = r.configs()["testnamespace/gateway-1"]
    ports = sorted((ls.port, ls.public_port) for ls in cfg.listeners)
    assert ports == [(11, 1), (13, 2)]
    render_ = r.gateway("testnamespace", "gateway-1")
    assert render_ is not None
    assert render_.service is not None
    assert [p["targetPort"] for p in render_.service["spec"]["ports"]] == [11, 13]
    assert render_.status is not None
    assert conditions(render_.status)["Programmed"] == ("True", "Programmed")


def test_e2e_invalidation_puts_service_and_deployment_on_the_delete_list(render: Render) -> None:
    r = render(
        HIERARCHY.replace("name: default}", "name: elsewhere}"), GATEWAY_1, ROUTE_OK, BACKEND, LB
    )
    assert r.configs() == {}
    gw = r.gateway("testnamespace", "gateway-1")
    assert gw is not None
    assert gw.deployment is None
    assert gw.service is None
    assert ("Deployment", "testnamespace", "gateway-1") in gw.deletes
    route = r.statuses()[("UDPRoute", "testnamespace", "udproute-ok")]
    assert conditions(route.parents[0])["Accepted"] == ("False", "Pending")  # type: ignore[union-attr]
