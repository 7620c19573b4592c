"""Listeners: protocols, port conflicts, TLS material, target ports and public addresses."""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable

import pytest

from stunner_common.config.tls import self_signed_pair
from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, conditions, lb_service

Render = Callable[..., Renderer]

CERT_B64, KEY_B64 = self_signed_pair(
    "test.example", now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
)
CERT_PEM = base64.b64decode(CERT_B64).decode()
KEY_PEM = base64.b64decode(KEY_B64).decode()


def gateway(listeners: str, *, annotations: str = "{}", addresses: str = "[]") -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: stunner, uid: u-1, annotations: {annotations}}}
spec:
  gatewayClassName: stunner
  addresses: {addresses}
  listeners: {listeners}
"""


def tls_secret(
    name: str = "tls",
    *,
    keys: tuple[str, str] = ("tls.crt", "tls.key"),
    type_: str = "kubernetes.io/tls",
) -> str:
    cert = CERT_PEM.replace("\n", "\\n")
    key = KEY_PEM.replace("\n", "\\n")
    return f"""
apiVersion: v1
kind: Secret
metadata: {{name: {name}, namespace: stunner}}
type: {type_}
stringData: {{"{keys[0]}": "{cert}", "{keys[1]}": "{key}"}}
"""


def listener_status(r: Renderer, name: str) -> dict[str, tuple[str, str]]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    return conditions(next(ls for ls in gw.status.listeners if ls.name == name))


@pytest.mark.parametrize(
    ("proto", "rendered"),
    [
        ("TURN-UDP", "TURN-UDP"),
        ("TURN-TCP", "TURN-TCP"),
        ("UDP", "TURN-UDP"),
        ("TCP", "TURN-TCP"),
    ],
)
def test_listener_protocols_and_legacy_aliases_render_as_turn(
    render: Render, proto: str, rendered: str
) -> None:
    r = render(HIERARCHY, gateway(f"[{{name: l, port: 3478, protocol: {proto}}}]"))
    (ls,) = r.configs()["stunner/gw"].listeners
    assert ls.protocol == rendered
    assert ls.port == 3478
    assert ls.name == "stunner/gw/l"


def test_unknown_protocol_leaves_listener_out_with_unsupported_protocol(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: ok, port: 3478, protocol: TURN-UDP}, {name: web, port: 80, protocol: HTTP}]"
        ),
    )
    assert [ls.name for ls in r.configs()["stunner/gw"].listeners] == ["stunner/gw/ok"]
    assert listener_status(r, "web")["Accepted"] == ("False", "UnsupportedProtocol")


def test_same_port_in_same_family_conflicts_but_udp_and_tcp_do_not(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(
            "[{name: a, port: 3478, protocol: TURN-UDP}, {name: b, port: 3478, protocol: TURN-TCP},"
            " {name: c, port: 3478, protocol: UDP}]"
        ),
    )
    names = [ls.name for ls in r.configs()["stunner/gw"].listeners]
    assert names == ["stunner/gw/a", "stunner/gw/b"]
    assert listener_status(r, "c") == {
        "Accepted": ("False", "PortUnavailable"),
        "Conflicted": ("True", "PortConflict"),  # UDP is TURN-UDP
        "ResolvedRefs": ("True", "ResolvedRefs"),
        "Programmed": ("False", "Invalid"),
    }


def test_tls_listener_takes_cert_and_key_from_the_secret(render: Render) -> None:
    listeners = (
        "[{name: tls, port: 443, protocol: TURN-TLS, tls: {certificateRefs: [{name: tls}]}}]"
    )
    r = render(HIERARCHY, tls_secret(), gateway(listeners))
    (ls,) = r.configs()["stunner/gw"].listeners
    assert base64.b64decode(ls.cert).decode() == CERT_PEM
    assert base64.b64decode(ls.key).decode() == KEY_PEM
    assert listener_status(r, "tls")["ResolvedRefs"] == ("True", "ResolvedRefs")


@pytest.mark.parametrize(
    ("keys", "type_"),
    [
        (("tls.crt", "tls.key"), "Opaque"),
        (("crt", "key"), "Opaque"),
        (("cert", "key"), "kubernetes.io/tls"),
    ],
)
def test_tls_secret_type_is_not_enforced_and_alternative_keys_work(
    render: Render, keys: tuple[str, str], type_: str
) -> None:
    listeners = (
        "[{name: d, port: 443, protocol: TURN-DTLS,"
        " tls: {mode: Terminate, certificateRefs: [{name: tls}]}}]"
    )
    r = render(HIERARCHY, tls_secret(keys=keys, type_=type_), gateway(listeners))
    (ls,) = r.configs()["stunner/gw"].listeners
    assert ls.protocol == "TURN-DTLS"
    assert ls.cert


def test_first_working_certificate_ref_wins(render: Render) -> None:
    listeners = (
        "[{name: tls, port: 443, protocol: TURN-TLS, tls: {certificateRefs: "
        "[{name: missing}, {name: wrong, kind: ConfigMap}, {name: tls}]}}]"
    )
    r = render(HIERARCHY, tls_secret(), gateway(listeners))
    assert r.configs()["stunner/gw"].listeners[0].cert


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ("", "listener tls needs tls.certificateRefs"),
        (", tls: {certificateRefs: []}", "listener tls needs tls.certificateRefs"),
        (
            ", tls: {mode: Passthrough, certificateRefs: [{name: tls}]}",
            "tls.mode Passthrough is not supported",
        ),
        (", tls: {certificateRefs: [{name: nope}]}", "Secret stunner/nope not found"),
        (
            ", tls: {certificateRefs: [{name: nope, namespace: other}]}",
            "Secret other/nope not found",
        ),
        (
            ", tls: {certificateRefs: [{name: bad}]}",
            "Secret stunner/bad needs the keys tls.crt and tls.key",
        ),
    ],
)
def test_unusable_tls_listener_is_left_out_with_invalid_certificate_ref(
    render: Render, tls: str, message: str
) -> None:
    bad = """
apiVersion: v1
kind: Secret
metadata: {name: bad, namespace: stunner}
stringData: {foo: bar}
"""
    listeners = (
        "[{name: udp, port: 3478, protocol: TURN-UDP},"
        f" {{name: tls, port: 443, protocol: TURN-TLS{tls}}}]"
    )
    r = render(HIERARCHY, tls_secret(), bad, gateway(listeners))
    assert [ls.name for ls in r.configs()["stunner/gw"].listeners] == ["stunner/gw/udp"]
    st = listener_status(r, "tls")
    assert st["Accepted"] == ("True", "Accepted")
    assert st["ResolvedRefs"] == ("False", "InvalidCertificateRef")
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    tls_status = next(ls for ls in gw.status.listeners if ls.name == "tls")
    assert message in tls_status.conditions[2].message
    assert tls_status.attached_routes == 0


def test_garbage_certificate_is_reported_on_the_listener(render: Render) -> None:
    garbage = """
apiVersion: v1
kind: Secret
metadata: {name: tls, namespace: stunner}
stringData: {tls.crt: not-a-pem, tls.key: not-a-pem}
"""
    listeners = (
        "[{name: udp, port: 3478, protocol: TURN-UDP},"
        " {name: tls, port: 443, protocol: TURN-TLS, tls: {certificateRefs: [{name: tls}]}}]"
    )
    r = render(HIERARCHY, garbage, gateway(listeners))
    assert [ls.name for ls in r.configs()["stunner/gw"].listeners] == ["stunner/gw/udp"]
    assert listener_status(r, "tls")["ResolvedRefs"] == ("False", "InvalidCertificateRef")


def test_targetport_annotation_changes_the_port_stunnerd_binds(render: Render) -> None:
    ann = """{stunner.l7mp.io/targetport: '{"udp":13478}'}"""
    r = render(
        HIERARCHY,
        gateway(
            "[{name: udp, port: 3478, protocol: TURN-UDP}]",
            annotations=ann,
            addresses="[{value: 1.2.3.4}]",
        ),
    )
    (ls,) = r.configs()["stunner/gw"].listeners
    assert ls.port == 13478
    assert (ls.public_address, ls.public_port) == ("1.2.3.4", 3478)


# -- public addresses -------------------------------------------------------------------------


NODE = """
apiVersion: v1
kind: Node
metadata: {name: n1}
status:
  addresses: [{type: InternalIP, address: 10.0.0.1}, {type: ExternalIP, address: 198.51.100.7}]
"""

UDP = "[{name: udp, port: 3478, protocol: TURN-UDP}]"
SVC_UDP = "[{name: udp, protocol: UDP, port: 3478, nodePort: 30001}]"


def public(r: Renderer) -> list[tuple[str, int]]:
    return [(ls.public_address, ls.public_port) for ls in r.configs()["stunner/gw"].listeners]


def test_public_address_comes_from_the_load_balancer_ingress_ip(render: Render) -> None:
    r = render(HIERARCHY, gateway(UDP), lb_service(ports=SVC_UDP, ingress="[{ip: 34.1.2.3}]"))
    assert public(r) == [("34.1.2.3", 3478)]
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    assert conditions(gw.status)["Programmed"] == ("True", "Programmed")
    assert gw.status.addresses == (("IPAddress", "34.1.2.3"),)


def test_ingress_with_a_matching_port_status_is_preferred(render: Render) -> None:
    ingress = (
        "[{ip: 1.1.1.1, ports: [{port: 9, protocol: UDP}]},"
        " {ip: 2.2.2.2, ports: [{port: 3478, protocol: UDP}]}]"
    )
    r = render(HIERARCHY, gateway(UDP), lb_service(ports=SVC_UDP, ingress=ingress))
    assert public(r) == [("2.2.2.2", 3478)]


def test_ingress_hostname_is_used_when_there_is_no_ip(render: Render) -> None:
    r = render(
        HIERARCHY, gateway(UDP), lb_service(ports=SVC_UDP, ingress="[{hostname: lb.example.com}]")
    )
    assert public(r) == [("lb.example.com", 3478)]
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    assert gw.status.addresses == (("Hostname", "lb.example.com"),)


def test_nodeport_service_uses_a_node_external_ip_and_the_node_port(render: Render) -> None:
    r = render(HIERARCHY, gateway(UDP), lb_service(type_="NodePort", ports=SVC_UDP), NODE)
    assert public(r) == [("198.51.100.7", 30001)]


def test_pending_load_balancer_falls_back_to_a_node_address(render: Render) -> None:
    r = render(HIERARCHY, gateway(UDP), lb_service(ports=SVC_UDP), NODE)
    assert public(r) == [("198.51.100.7", 30001)]


def test_second_node_is_used_when_the_first_has_no_external_ip(render: Render) -> None:
    internal_only = """
apiVersion: v1
kind: Node
metadata: {name: a-internal}
status: {addresses: [{type: InternalIP, address: 10.0.0.2}]}
"""
    r = render(
        HIERARCHY, gateway(UDP), lb_service(type_="NodePort", ports=SVC_UDP), internal_only, NODE
    )
    assert public(r) == [("198.51.100.7", 30001)]


def test_spec_addresses_hint_wins_over_the_service(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(UDP, addresses="[{type: IPAddress, value: 5.6.7.8}]"),
        lb_service(ports=SVC_UDP, ingress="[{ip: 34.1.2.3}]"),
    )
    assert public(r) == [("5.6.7.8", 3478)]
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.service is not None
    assert gw.service["spec"]["loadBalancerIP"] == "5.6.7.8"


def test_service_port_with_wrong_protocol_gives_no_address(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(UDP),
        lb_service(ports="[{name: udp, protocol: TCP, port: 3478}]", ingress="[{ip: 3.3.3.3}]"),
    )
    assert public(r) == [("", 0)]
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    assert conditions(gw.status)["Programmed"] == ("False", "AddressNotAssigned")


def test_service_owned_by_another_gateway_is_ignored(render: Render) -> None:
    r = render(
        HIERARCHY,
        gateway(UDP),
        lb_service(ports=SVC_UDP, ingress="[{ip: 3.3.3.3}]", owner_uid="other"),
    )
    assert public(r) == [("", 0)]


def test_without_service_or_hint_the_gateway_is_not_programmed(render: Render) -> None:
    r = render(HIERARCHY, gateway(UDP))
    assert public(r) == [("", 0)]
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    programmed = gw.status.condition("Programmed")
    assert programmed is not None
    assert programmed.reason == "AddressNotAssigned"
    assert "waiting for a public address on Service stunner/gw" in programmed.message


MIXED = "[{name: udp, port: 3478, protocol: TURN-UDP}, {name: tcp, port: 3479, protocol: TURN-TCP}]"


def test_mixed_protocols_expose_only_the_first_protocol_by_default(render: Render) -> None:
    r = render(HIERARCHY, gateway(MIXED, addresses="[{value: 1.2.3.4}]"))
    assert public(r) == [("", 0), ("1.2.3.4", 3478)]  # sorted: stunner/gw/tcp, stunner/gw/udp
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.service is not None
    assert [p["name"] for p in gw.service["spec"]["ports"]] == ["udp"]
    assert gw.status is not None
    programmed = gw.status.condition("Programmed")
    assert programmed is not None
    assert "enable-mixed-protocol-lb" in programmed.message


@pytest.mark.parametrize(
    ("gw_ann", "gwconfig_ann", "exposed"),
    [
        ("{stunner.l7mp.io/enable-mixed-protocol-lb: 'true'}", "{}", ["udp", "tcp"]),
        ("{stunner.l7mp.io/enable-mixed-protocol-lb: 'True'}", "{}", ["udp", "tcp"]),
        ("{}", "{stunner.l7mp.io/enable-mixed-protocol-lb: 'true'}", ["udp", "tcp"]),
        (
            "{stunner.l7mp.io/enable-mixed-protocol-lb: 'false'}",
            "{stunner.l7mp.io/enable-mixed-protocol-lb: 'true'}",
            ["udp"],
        ),
        ("{stunner.l7mp.io/enable-mixed-protocol-lb: 'dummy'}", "{}", ["udp"]),
    ],
)
def test_mixed_protocol_annotation_from_gateway_or_gateway_config(
    render: Render, gw_ann: str, gwconfig_ann: str, exposed: list[str]
) -> None:
    h = HIERARCHY.replace(
        "spec: {authType", f"spec: {{loadBalancerServiceAnnotations: {gwconfig_ann}, authType"
    )
    r = render(h, gateway(MIXED, annotations=gw_ann, addresses="[{value: 1.2.3.4}]"))
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.service is not None
    assert [p["name"] for p in gw.service["spec"]["ports"]] == exposed


def test_service_without_the_related_gateway_annotation_is_not_the_public_service(
    render: Render,
) -> None:
    svc = lb_service(ports=SVC_UDP, ingress="[{ip: 3.3.3.3}]").replace(
        "stunner.l7mp.io/related-gateway-name", "example.com/something-else"
    )
    r = render(HIERARCHY, gateway(UDP), svc)
    assert public(r) == [("", 0)]


def _secret(cert_pem: str, key_pem: str) -> str:
    cert = cert_pem.replace("\n", "\\n")
    key = key_pem.replace("\n", "\\n")
    return f"""
apiVersion: v1
kind: Secret
metadata: {{name: tls, namespace: stunner}}
type: kubernetes.io/tls
stringData: {{tls.crt: "{cert}", tls.key: "{key}"}}
"""


OTHER_KEY_PEM = base64.b64decode(self_signed_pair("other.example")[1]).decode()
GARBAGE_CERT_PEM = (
    "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
)


@pytest.mark.parametrize(
    ("cert_pem", "key_pem", "message"),
    [
        (CERT_PEM, OTHER_KEY_PEM, "private key does not match the certificate"),
        (GARBAGE_CERT_PEM, KEY_PEM, "cannot load cert/key pair"),
    ],
    ids=["mismatched-key", "garbage-between-markers"],
)
def test_a_secret_stunnerd_could_not_load_leaves_the_listener_out(
    render: Render, cert_pem: str, key_pem: str, message: str
) -> None:
    listeners = (
        "[{name: udp, port: 3478, protocol: TURN-UDP},"
        " {name: tls, port: 443, protocol: TURN-TLS, tls: {certificateRefs: [{name: tls}]}}]"
    )
    r = render(HIERARCHY, _secret(cert_pem, key_pem), gateway(listeners))
    assert [ls.name for ls in r.configs()["stunner/gw"].listeners] == ["stunner/gw/udp"]
    st = listener_status(r, "tls")
    assert st["ResolvedRefs"] == ("False", "InvalidCertificateRef")
    assert st["Programmed"][0] == "False"
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    tls_status = next(ls for ls in gw.status.listeners if ls.name == "tls")
    resolved = next(c for c in tls_status.conditions if c.type == "ResolvedRefs")
    assert resolved.message.startswith("Secret stunner/tls: ")
    assert message in resolved.message
