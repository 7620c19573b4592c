"""GatewayClass -> GatewayConfig -> Dataplane resolution, auth rendering and the admin section."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, UDP_GATEWAY, conditions

Render = Callable[..., Renderer]


def gateway_error(renderer: Renderer) -> str:
    render = renderer.gateway("stunner", "gw")
    assert render is not None
    assert render.status is not None
    accepted = render.status.condition("Accepted")
    assert accepted is not None
    return accepted.message


def test_valid_hierarchy_renders_one_config_named_after_the_gateway(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY)
    cfg = r.configs()["stunner/gw"]
    assert cfg.admin.name == "stunner/gw"
    assert cfg.auth.type == "static"
    assert cfg.auth.credentials == {"username": "user-1", "password": "pass-1"}
    assert cfg.auth.realm == "stunner.l7mp.io"
    assert [ls.name for ls in cfg.listeners] == ["stunner/gw/udp"]
    assert cfg.listeners[0].address == "$STUNNER_ADDR"
    assert conditions(r.statuses()[("GatewayClass", "", "stunner")]) == {
        "Accepted": ("True", "Accepted")
    }


def test_gateway_of_another_controller_gets_no_config_and_no_status(render: Render) -> None:
    other = HIERARCHY.replace("stunner.l7mp.io/gateway-operator", "example.com/other")
    r = render(other, UDP_GATEWAY)
    assert r.configs() == {}
    assert r.statuses() == {}


def test_gateway_with_unknown_class_gets_no_status(render: Render) -> None:
    r = render(HIERARCHY, UDP_GATEWAY.replace("gatewayClassName: stunner", "gatewayClassName: x"))
    assert r.configs() == {}
    assert ("Gateway", "stunner", "gw") not in r.statuses()


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "GatewayConfig, name: gwconfig",
            "GatewayConfig, name: missing",
            "GatewayConfig stunner/missing not found",
        ),
        (
            "kind: GatewayConfig, name",
            "kind: ConfigMap, name",
            "must reference a stunner.l7mp.io GatewayConfig",
        ),
        (
            "group: stunner.l7mp.io, kind",
            "group: example.com, kind",
            "must reference a stunner.l7mp.io GatewayConfig",
        ),
        (", namespace: stunner}", "}", "needs both name and namespace"),
    ],
)
def test_broken_parameters_ref_invalidates_class_and_gateways(
    render: Render, old: str, new: str, message: str
) -> None:
    r = render(HIERARCHY.replace(old, new), UDP_GATEWAY)
    assert r.configs() == {}
    cls = r.statuses()[("GatewayClass", "", "stunner")]
    assert conditions(cls) == {"Accepted": ("False", "InvalidParameters")}
    assert message in cls.conditions[0].message  # type: ignore[union-attr]
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.status is not None
    assert conditions(gw.status) == {
        "Accepted": ("False", "Pending"),
        "Programmed": ("False", "Invalid"),
    }
    assert message in gateway_error(r)
    assert conditions(gw.status.listeners[0])["Accepted"] == ("Unknown", "Pending")
    assert set(gw.deletes) == {
        ("Service", "stunner", "gw"),
        ("Deployment", "stunner", "gw"),
        ("DaemonSet", "stunner", "gw"),
    }


def test_parameters_ref_defaults_group_and_kind(render: Render) -> None:
    r = render(HIERARCHY.replace("group: stunner.l7mp.io, kind: GatewayConfig, ", ""), UDP_GATEWAY)
    assert list(r.configs()) == ["stunner/gw"]


def test_missing_dataplane_invalidates_the_gateway(render: Render) -> None:
    no_dp = HIERARCHY.replace("name: default}", "name: other}")
    r = render(no_dp, UDP_GATEWAY)
    assert r.configs() == {}
    assert "Dataplane 'default' not found" in gateway_error(r)


def test_gateway_config_selects_its_dataplane_by_name(render: Render) -> None:
    h = HIERARCHY.replace("name: default}", "name: prod}").replace(
        "spec: {authType", "spec: {dataplane: prod, authType"
    )
    r = render(h, UDP_GATEWAY)
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.deployment is not None


def test_invalid_realm_invalidates_the_gateway(render: Render) -> None:
    r = render(
        HIERARCHY.replace("spec: {authType", "spec: {realm: Bad_Realm, authType"), UDP_GATEWAY
    )
    assert r.configs() == {}
    assert "invalid realm 'Bad_Realm'" in gateway_error(r)


AUTH_CASES = [
    ("{authType: static, userName: u, password: p}", "static", {"username": "u", "password": "p"}),
    (
        "{authType: plaintext, userName: u, password: p}",
        "static",
        {"username": "u", "password": "p"},
    ),
    ("{userName: u, password: p}", "static", {"username": "u", "password": "p"}),
    ("{authType: ephemeral, sharedSecret: s}", "ephemeral", {"secret": "s"}),
    ("{authType: timewindowed, sharedSecret: s}", "ephemeral", {"secret": "s"}),
    ("{authType: longterm, sharedSecret: s}", "ephemeral", {"secret": "s"}),
    (
        "{authType: ephemeral, sharedSecret: s, authLifetime: 60}",
        "ephemeral",
        {"secret": "s", "lifetime": "60"},
    ),
]


@pytest.mark.parametrize(("spec", "kind", "creds"), AUTH_CASES)
def test_inline_auth_variants_render_with_aliases_normalised(
    render: Render, spec: str, kind: str, creds: dict[str, str]
) -> None:
    h = HIERARCHY.replace(
        "spec: {authType: static, userName: user-1, password: pass-1}", f"spec: {spec}"
    )
    cfg = render(h, UDP_GATEWAY).configs()["stunner/gw"]
    assert cfg.auth.type == kind
    assert cfg.auth.credentials == creds


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{authType: magic, userName: u, password: p}", "unknown auth type 'magic'"),
        ("{authType: static, userName: u}", "static auth needs spec.userName and spec.password"),
        ("{authType: static, password: p}", "static auth needs spec.userName and spec.password"),
        ("{authType: longterm}", "ephemeral auth needs spec.sharedSecret"),
    ],
)
def test_bad_inline_auth_invalidates_the_gateway_with_a_clear_message(
    render: Render, spec: str, message: str
) -> None:
    h = HIERARCHY.replace(
        "spec: {authType: static, userName: user-1, password: pass-1}", f"spec: {spec}"
    )
    r = render(h, UDP_GATEWAY)
    assert r.configs() == {}
    assert message in gateway_error(r)


def auth_secret(data: str, *, ns: str = "stunner", name: str = "auth") -> str:
    return f"""
apiVersion: v1
kind: Secret
metadata: {{name: {name}, namespace: {ns}}}
type: Opaque
{data}
"""


EXTERNAL = HIERARCHY.replace(
    "spec: {authType: static, userName: user-1, password: pass-1}",
    "spec: {authType: static, userName: inline, password: inline, authRef: {name: auth}}",
)


@pytest.mark.parametrize(
    ("data", "kind", "creds"),
    [
        (
            "stringData: {username: su, password: sp}",
            "static",
            {"username": "su", "password": "sp"},
        ),
        (
            "stringData: {type: plaintext, username: su, password: sp}",
            "static",
            {"username": "su", "password": "sp"},
        ),
        ("stringData: {type: ephemeral, secret: xx}", "ephemeral", {"secret": "xx"}),
        ("stringData: {type: longterm, sharedSecret: yy}", "ephemeral", {"secret": "yy"}),
        ("data: {type: ZXBoZW1lcmFs, secret: Ymlu}", "ephemeral", {"secret": "bin"}),
    ],
)
def test_external_auth_secret_overrides_inline_fields(
    render: Render, data: str, kind: str, creds: dict[str, str]
) -> None:
    cfg = render(EXTERNAL, auth_secret(data), UDP_GATEWAY).configs()["stunner/gw"]
    assert cfg.auth.type == kind
    assert cfg.auth.credentials == creds


def test_missing_auth_secret_invalidates_without_falling_back_to_inline(render: Render) -> None:
    r = render(EXTERNAL, UDP_GATEWAY)
    assert r.configs() == {}
    assert gateway_error(r) == "Secret stunner/auth not found"


def test_auth_ref_namespace_is_honoured(render: Render) -> None:
    h = EXTERNAL.replace("authRef: {name: auth}", "authRef: {name: auth, namespace: other}")
    r = render(h, auth_secret("stringData: {username: a, password: b}", ns="other"), UDP_GATEWAY)
    assert r.configs()["stunner/gw"].auth.credentials == {"username": "a", "password": "b"}


@pytest.mark.parametrize(
    "ref", ["{name: auth, kind: ConfigMap}", "{name: auth, group: example.com}"]
)
def test_auth_ref_to_something_else_than_a_secret_errs(render: Render, ref: str) -> None:
    h = EXTERNAL.replace("authRef: {name: auth}", f"authRef: {ref}")
    r = render(h, auth_secret("stringData: {username: a, password: b}"), UDP_GATEWAY)
    assert r.configs() == {}
    assert "authRef must point to a Secret" in gateway_error(r)


def test_auth_secret_without_credentials_errs(render: Render) -> None:
    r = render(EXTERNAL, auth_secret("stringData: {type: static, username: a}"), UDP_GATEWAY)
    assert r.configs() == {}
    assert "needs the keys username and password" in gateway_error(r)


def test_admin_follows_gateway_config_and_dataplane(render: Render) -> None:
    h = HIERARCHY.replace(
        'spec: {image: "stunnerd:test"}',
        'spec: {image: "stunnerd:test", enableMetricsEndpoint: true, disableHealthCheck: true}',
    ).replace("spec: {authType", "spec: {logLevel: 'all:DEBUG', authType")
    admin = render(h, UDP_GATEWAY).configs()["stunner/gw"].admin
    assert admin.loglevel == "all:DEBUG"
    assert admin.metrics_endpoint == "http://:8080/metrics"
    assert admin.healthcheck_endpoint == ""


def test_admin_defaults(render: Render) -> None:
    admin = render(HIERARCHY, UDP_GATEWAY).configs()["stunner/gw"].admin
    assert admin.loglevel == "all:INFO"
    assert admin.metrics_endpoint == ""
    assert admin.healthcheck_endpoint == "http://:8086"
    assert admin.offload_engine == "None"
