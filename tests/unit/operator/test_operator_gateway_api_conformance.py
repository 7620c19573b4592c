"""What the Gateway API conformance suite reads: ReferenceGrants (opt-in), supportedFeatures,
listener supportedKinds, parentRef ports and the Gateway's Accepted reason.

Cross-namespace references resolve without a ReferenceGrant by default (upstream STUNner's
behaviour); ``RenderOptions.enforce_reference_grants`` (``--enforce-reference-grants``) makes
a backendRef into another namespace, and a certificateRef to a Secret of another namespace,
need one, with ``ResolvedRefs=False, RefNotPermitted`` where none allows the reference.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable

import pytest

from stunner_common.config.tls import self_signed_pair
from stunner_operator.__main__ import _options, _parser
from stunner_operator.k8s.resources import REFERENCE_GRANTS, WATCHED, watched
from stunner_operator.render.engine import Renderer
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.status import GatewayClassStatus, RouteStatus
from stunner_operator.settings import OperatorSettings
from support.operator import HIERARCHY, UDP_GATEWAY, conditions, objects_from_yaml

Render = Callable[..., Renderer]
ENFORCED = RenderOptions(enforce_reference_grants=True)

SERVICE = """
apiVersion: v1
kind: Service
metadata: {name: svc, namespace: media}
spec: {clusterIP: 10.96.0.5, ports: [{port: 9, protocol: UDP}]}
---
apiVersion: stunner.l7mp.io/v1
kind: StaticService
metadata: {name: ext, namespace: media}
spec: {prefixes: [192.0.2.0/24]}
"""


def route(
    *, api: str = "stunner.l7mp.io/v1", backend: str = "{name: svc, namespace: media}"
) -> str:
    return f"""
apiVersion: {api}
kind: UDPRoute
metadata: {{name: r, namespace: stunner}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{backend}]}}]
"""


def grant(
    *,
    from_group: str = "stunner.l7mp.io",
    from_kind: str = "UDPRoute",
    from_ns: str = "stunner",
    to_group: str = '""',
    to_kind: str = "Service",
    to_name: str = "svc",
    ns: str = "media",
) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: g, namespace: {ns}}}
spec:
  from: [{{group: {from_group}, kind: {from_kind}, namespace: {from_ns}}}]
  to: [{{group: {to_group}, kind: {to_kind}, name: {to_name}}}]
"""


def resolved(r: Renderer, kind: str = "UDPRoute") -> tuple[str, str]:
    status = r.statuses()[(kind, "stunner", "r")]
    assert isinstance(status, RouteStatus)
    return conditions(status.parents[0])["ResolvedRefs"]


def endpoints(r: Renderer) -> tuple[str, ...]:
    return tuple(e for c in r.configs()["stunner/gw"].clusters for e in c.endpoints)


@pytest.mark.parametrize(
    ("options", "objects", "expected"),
    [
        (None, (), ("True", "ResolvedRefs")),
        (ENFORCED, (), ("False", "RefNotPermitted")),
        (ENFORCED, (grant(),), ("True", "ResolvedRefs")),
        (ENFORCED, (grant(to_name="other"),), ("False", "RefNotPermitted")),
        (ENFORCED, (grant(from_ns="team"),), ("False", "RefNotPermitted")),
        (ENFORCED, (grant(from_kind="TCPRoute"),), ("False", "RefNotPermitted")),
        (ENFORCED, (grant(from_group="gateway.networking.k8s.io"),), ("False", "RefNotPermitted")),
        (ENFORCED, (grant(ns="stunner"),), ("False", "RefNotPermitted")),  # not the target's ns
        (ENFORCED, (grant(to_name='""'),), ("True", "ResolvedRefs")),  # every Service of media
    ],
)
def test_cross_namespace_backend_needs_a_grant_only_where_enforced(
    render: Render,
    options: RenderOptions | None,
    objects: tuple[str, ...],
    expected: tuple[str, str],
) -> None:
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, route(), *objects, options=options)
    assert resolved(r) == expected
    assert bool(endpoints(r)) == (expected[0] == "True")


def test_gateway_api_route_and_static_service_are_granted_by_their_own_group_and_kind(
    render: Render,
) -> None:
    api_route = route(api="gateway.networking.k8s.io/v1")
    gw_grant = grant(from_group="gateway.networking.k8s.io")
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, api_route, gw_grant, options=ENFORCED)
    assert resolved(r, "UDPRouteV1A2") == ("True", "ResolvedRefs")

    static = route(
        backend="{group: stunner.l7mp.io, kind: StaticService, name: ext, namespace: media}"
    )
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, static, grant(), options=ENFORCED)
    assert resolved(r) == ("False", "RefNotPermitted")
    static_grant = grant(to_group="stunner.l7mp.io", to_kind="StaticService", to_name="ext")
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, static, static_grant, options=ENFORCED)
    assert resolved(r) == ("True", "ResolvedRefs")
    assert endpoints(r) == ("192.0.2.0/24",)


def test_creating_and_deleting_a_grant_re_renders_the_route(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY, SERVICE, route(), options=ENFORCED)
    assert resolved(r) == ("False", "RefNotPermitted")

    (granted,) = objects_from_yaml(grant())
    r.apply([granted])
    assert resolved(r) == ("True", "ResolvedRefs")
    assert endpoints(r)
    r.apply([], deletes=[("ReferenceGrant", "media", "g")])
    assert resolved(r) == ("False", "RefNotPermitted")
    assert not endpoints(r)


CERT_B64, KEY_B64 = self_signed_pair(
    "test.example", now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
)
SECRET = f"""
apiVersion: v1
kind: Secret
metadata: {{name: tls, namespace: certs}}
type: kubernetes.io/tls
data: {{tls.crt: {base64.b64encode(base64.b64decode(CERT_B64)).decode()}, tls.key: {KEY_B64}}}
"""
TLS_GATEWAY = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: stunner}
spec:
  gatewayClassName: stunner
  addresses: [{value: 1.2.3.4}]
  listeners:
  - name: tls
    port: 443
    protocol: TURN-TLS
    tls: {certificateRefs: [{name: tls, namespace: certs}]}
"""
SECRET_GRANT = grant(
    from_group="gateway.networking.k8s.io", from_kind="Gateway", to_kind="Secret", to_name="tls"
).replace("namespace: media", "namespace: certs")


@pytest.mark.parametrize(
    ("options", "objects", "expected"),
    [
        (None, (), ("True", "ResolvedRefs")),
        (ENFORCED, (), ("False", "RefNotPermitted")),
        (ENFORCED, (SECRET_GRANT,), ("True", "ResolvedRefs")),
    ],
)
def test_cross_namespace_certificate_needs_a_grant_only_where_enforced(
    render: Render,
    options: RenderOptions | None,
    objects: tuple[str, ...],
    expected: tuple[str, str],
) -> None:
    r = render(HIERARCHY, SECRET, TLS_GATEWAY, *objects, options=options)
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    assert conditions(gw.status.listeners[0])["ResolvedRefs"] == expected
    listeners = r.configs()["stunner/gw"].listeners
    assert [ls.name for ls in listeners] == (["stunner/gw/tls"] if expected[0] == "True" else [])


@pytest.mark.parametrize(
    ("options", "features"),
    [
        (None, [{"name": "Gateway"}, {"name": "UDPRoute"}]),
        (ENFORCED, [{"name": "Gateway"}, {"name": "ReferenceGrant"}, {"name": "UDPRoute"}]),
    ],
)
def test_gateway_class_status_lists_supported_features_sorted(
    render: Render, options: RenderOptions | None, features: list[dict[str, str]]
) -> None:
    r = render(HIERARCHY, options=options)
    status = r.statuses()[("GatewayClass", "", "stunner")]
    assert isinstance(status, GatewayClassStatus)
    assert status.to_k8s()["supportedFeatures"] == features


def gateway(listeners: str) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: stunner}}
spec:
  gatewayClassName: stunner
  addresses: [{{value: 1.2.3.4}}]
  listeners: {listeners}
"""


def test_listener_supported_kinds_follow_allowed_routes_kinds(render: Render) -> None:
    gw = gateway(
        "[{name: std, port: 5300, protocol: UDP, allowedRoutes: {kinds: [{kind: UDPRoute}]}},"
        " {name: any, port: 5301, protocol: UDP},"
        " {name: bad, port: 5302, protocol: UDP, allowedRoutes: {kinds: [{kind: HTTPRoute}]}},"
        " {name: web, port: 80, protocol: HTTP}]"
    )
    r = render(HIERARCHY, gw, route())
    render_ = r.gateway("stunner", "gw")
    assert render_ is not None
    assert render_.status is not None
    kinds = {ls.name: ls.to_k8s(1)["supportedKinds"] for ls in render_.status.listeners}
    assert kinds == {
        "std": [{"group": "gateway.networking.k8s.io", "kind": "UDPRoute"}],
        "any": [
            {"group": "gateway.networking.k8s.io", "kind": "UDPRoute"},
            {"group": "stunner.l7mp.io", "kind": "UDPRoute"},
        ],
        "bad": [],
        "web": [],
    }
    statuses = {ls.name: conditions(ls) for ls in render_.status.listeners}
    assert statuses["bad"]["ResolvedRefs"] == ("False", "InvalidRouteKinds")
    # the stunner.l7mp.io route attaches only where its kind is allowed
    assert {ls.name: ls.attached_routes for ls in render_.status.listeners} == {
        "std": 0,
        "any": 1,
        "bad": 0,
        "web": 0,
    }
    assert conditions(render_.status)["Accepted"] == ("True", "ListenersNotValid")


def test_gateway_without_a_valid_listener_is_not_accepted(render: Render) -> None:
    r = render(HIERARCHY, gateway("[{name: invalid, port: 1111, protocol: INVALID}]"))
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    assert conditions(gw.status)["Accepted"] == ("False", "ListenersNotValid")
    assert gw.status.listeners[0].to_k8s(1)["supportedKinds"] == []


def test_parent_ref_port_selects_the_listener(render: Render) -> None:
    gw = gateway("[{name: a, port: 5300, protocol: UDP}, {name: b, port: 5301, protocol: UDP}]")
    by_port = route().replace("parentRefs: [{name: gw}]", "parentRefs: [{name: gw, port: 5301}]")
    r = render(HIERARCHY, gw, SERVICE, by_port)
    listeners = {ls.name: ls.routes for ls in r.configs()["stunner/gw"].listeners}
    assert listeners == {"stunner/gw/a": (), "stunner/gw/b": ("stunner/r",)}
    status = r.statuses()[("UDPRoute", "stunner", "r")]
    assert isinstance(status, RouteStatus)
    assert status.to_k8s()["parents"][0]["parentRef"] == {"name": "gw", "port": 5301}

    none = route().replace("parentRefs: [{name: gw}]", "parentRefs: [{name: gw, port: 9999}]")
    r = render(HIERARCHY, gw, SERVICE, none)
    status = r.statuses()[("UDPRoute", "stunner", "r")]
    assert isinstance(status, RouteStatus)
    accepted = status.parents[0].condition("Accepted")
    assert accepted is not None
    assert (accepted.status, accepted.reason) == ("False", "NotAllowedByListeners")
    assert "port 9999" in accepted.message


@pytest.mark.parametrize(
    ("argv", "env", "enforced"),
    [
        ([], {}, False),
        (["--enforce-reference-grants"], {}, True),
        ([], {"OPERATOR_ENFORCE_REFERENCE_GRANTS": "true"}, True),
        ([], {"OPERATOR_ENFORCE_REFERENCE_GRANTS": "false"}, False),
    ],
)
def test_the_opt_in_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str], enforced: bool
) -> None:
    monkeypatch.delenv("OPERATOR_ENFORCE_REFERENCE_GRANTS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = _parser().parse_args(argv)
    given = {"enforce_reference_grants": args.enforce_reference_grants}
    settings = OperatorSettings(**{k: v for k, v in given.items() if v is not None})
    assert settings.enforce_reference_grants is enforced
    assert _options(settings).enforce_reference_grants is enforced
    resources = watched(enforce_reference_grants=enforced)
    assert (REFERENCE_GRANTS in resources) is enforced
    assert resources[: len(WATCHED)] == WATCHED
