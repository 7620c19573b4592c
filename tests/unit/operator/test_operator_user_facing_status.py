"""What a user reads after applying YAML: effective-port clashes, unserved TLS listeners,
malformed annotations, the v1alpha1 metrics endpoint and the user quota (seed spellings)."""

from __future__ import annotations

from collections.abc import Callable

from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, conditions

Render = Callable[..., Renderer]


def gateway(listeners: str, annotations: str = "{}") -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
  namespace: stunner
  annotations: {annotations}
spec:
  gatewayClassName: stunner
  addresses: [{{type: IPAddress, value: 1.2.3.4}}]
  listeners: {listeners}
"""


ROUTE = """
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata: {name: media, namespace: stunner}
spec:
  parentRefs: [{name: gw, sectionName: %s}]
  rules: [{backendRefs: [{name: media-server}]}]
"""


def listener_conditions(r: Renderer, name: str) -> dict[str, tuple[str, str]]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    return conditions(next(ls for ls in gw.status.listeners if ls.name == name))


def listener_names(r: Renderer) -> list[str]:
    return [ls.name for ls in r.configs()["stunner/gw"].listeners]


def test_a_targetport_onto_another_listeners_port_is_a_conflict(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: a, port: 3478, protocol: TURN-UDP}, "
            "{name: b, port: 3479, protocol: TURN-UDP}]",
            "{stunner.l7mp.io/targetport: '{\"b\": 3478}'}",
        ),
    )
    assert listener_names(r) == ["stunner/gw/a"]
    conds = listener_conditions(r, "b")
    assert conds["Accepted"] == ("False", "PortUnavailable")
    assert conds["Conflicted"] == ("True", "PortConflict")
    assert conds["Programmed"] == ("False", "Invalid")
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    (message,) = [c.message for c in gw.status.listeners[1].conditions if c.type == "Accepted"]
    assert "target port 3478/UDP" in message
    assert "listener a" in message
    # The Service does not carry the conflicted listener either.
    assert gw.service is not None
    assert [p["name"] for p in gw.service["spec"]["ports"]] == ["a"]


def test_a_targetport_onto_a_port_of_the_other_family_is_fine(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: a, port: 3478, protocol: TURN-UDP}, {name: b, port: 443, protocol: TURN-TCP}]",
            "{stunner.l7mp.io/targetport: '{\"b\": 3478}', "
            "stunner.l7mp.io/enable-mixed-protocol-lb: 'true'}",
        ),
    )
    assert listener_names(r) == ["stunner/gw/a", "stunner/gw/b"]
    assert [ls.port for ls in r.configs()["stunner/gw"].listeners] == [3478, 3478]


def test_a_route_served_only_by_a_listener_without_certificate_is_not_accepted(
    render: Render,
) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: udp, port: 3478, protocol: TURN-UDP}, {name: tls, port: 443, "
            "protocol: TURN-TLS, tls: {certificateRefs: [{name: missing-secret}]}}]"
        ),
        ROUTE % "tls",
    )
    conds = listener_conditions(r, "tls")
    assert conds["ResolvedRefs"] == ("False", "InvalidCertificateRef")
    assert conds["Programmed"] == ("False", "Invalid")
    assert listener_names(r) == ["stunner/gw/udp"]
    assert r.configs()["stunner/gw"].clusters == ()
    route = r.statuses()[("UDPRoute", "stunner", "media")].to_k8s()
    (accepted,) = [c for c in route["parents"][0]["conditions"] if c["type"] == "Accepted"]
    assert (accepted["status"], accepted["reason"]) == ("False", "Pending")
    assert "Secret stunner/missing-secret not found" in accepted["message"]
    # The Gateway's Programmed message names the certificate, not the mixed-protocol annotation.
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    programmed = gw.status.condition("Programmed")
    assert programmed is not None
    assert "no usable TLS certificate" in programmed.message
    assert "mixed-protocol" not in programmed.message


def test_the_same_route_on_a_served_listener_is_accepted(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: udp, port: 3478, protocol: TURN-UDP}, {name: tls, port: 443, "
            "protocol: TURN-TLS, tls: {certificateRefs: [{name: missing-secret}]}}]"
        ),
        ROUTE % "udp",
    )
    route = r.statuses()[("UDPRoute", "stunner", "media")].to_k8s()
    assert route["parents"][0]["conditions"][0]["reason"] == "Accepted"


def test_conflicted_listeners_get_no_mixed_protocol_advice(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: tcp, port: 3478, protocol: TURN-TCP}, {name: tls, port: 3478, "
            "protocol: TURN-TLS, tls: {certificateRefs: [{name: s}]}}]"
        ),
    )
    assert listener_conditions(r, "tls")["Conflicted"] == ("True", "ProtocolConflict")
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    programmed = gw.status.condition("Programmed")
    assert programmed is not None
    assert programmed.message == "listener(s) tls conflict on a port"


def test_malformed_annotations_are_named_and_the_rest_still_renders(render: Render) -> None:
    annotations = (
        "{stunner.l7mp.io/nodeport: 'not json', stunner.l7mp.io/service-type: None, "
        "stunner.l7mp.io/targetport: '{\"udp\": 70000}'}"
    )
    r = render(HIERARCHY, gateway("[{name: udp, port: 3478, protocol: TURN-UDP}]", annotations))
    assert listener_names(r) == ["stunner/gw/udp"]
    assert r.configs()["stunner/gw"].listeners[0].port == 3478
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.service is not None
    assert gw.service["spec"]["type"] == "LoadBalancer"
    assert "nodePort" not in gw.service["spec"]["ports"][0]
    assert len(gw.warnings) == 3
    assert gw.status is not None
    accepted = gw.status.condition("Accepted")
    assert accepted is not None
    assert accepted.status == "True"
    for needle in (
        "stunner.l7mp.io/nodeport: 'not json' is not a JSON map",
        "stunner.l7mp.io/service-type: 'None' is not one of",
        "stunner.l7mp.io/targetport: port 70000 of listener 'udp' is not in 1-65535",
    ):
        assert needle in accepted.message


def test_annotation_naming_an_unknown_listener_is_reported(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: udp, port: 3478, protocol: TURN-UDP}]",
            "{stunner.l7mp.io/nodeport: '{\"udp-listener\": 30000}'}",
        ),
    )
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.warnings == (
        "annotation stunner.l7mp.io/nodeport: the Gateway has no listener 'udp-listener'",
    )


def test_seed_style_braceless_port_map_is_accepted_silently(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: udp, port: 3478, protocol: TURN-UDP}]",
            "{stunner.l7mp.io/nodeport: '\"udp\": 30000'}",
        ),
    )
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.warnings == ()
    assert gw.service is not None
    assert gw.service["spec"]["ports"][0]["nodePort"] == 30000


V1ALPHA1_CONFIG = """
apiVersion: stunner.l7mp.io/v1alpha1
kind: GatewayConfig
metadata: {name: gwconfig, namespace: stunner}
spec:
  realm: stunner.l7mp.io
  authType: plaintext
  userName: "user-1"
  password: "pass-1"
  metricsEndpoint: "http://0.0.0.0:8080/metrics"
"""


def test_v1alpha1_metrics_endpoint_reaches_the_config(render: Render) -> None:
    r = render(HIERARCHY, V1ALPHA1_CONFIG, gateway("[{name: u, port: 3478, protocol: UDP}]"))
    assert r.configs()["stunner/gw"].admin.metrics_endpoint == "http://0.0.0.0:8080/metrics"


def test_user_quota_reaches_the_config(render: Render) -> None:
    config = """
apiVersion: stunner.l7mp.io/v1
kind: GatewayConfig
metadata: {name: gwconfig, namespace: stunner}
spec: {authType: static, userName: user-1, password: pass-1, userQuota: 2}
"""
    r = render(HIERARCHY, config, gateway("[{name: u, port: 3478, protocol: UDP}]"))
    assert r.configs()["stunner/gw"].admin.user_quota == 2
    r = render(HIERARCHY, gateway("[{name: u, port: 3478, protocol: UDP}]"))
    assert r.configs()["stunner/gw"].admin.user_quota == 0
