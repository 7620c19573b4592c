"""Upstream's premium fields, rendered: STUN mode, DaemonSet and host networking, relay address
discovery, the cluster-wide quota's settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, UDP_GATEWAY

Render = Callable[..., Renderer]


def gwconfig(fields: str) -> str:
    return HIERARCHY.replace("spec: {authType", f"spec: {{{fields}, authType")


def dataplane(fields: str) -> str:
    return HIERARCHY.replace(
        'spec: {image: "stunnerd:test"}', f'spec: {{image: "stunnerd:test", {fields}}}'
    )


def workload(r: Renderer) -> dict[str, Any]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.deployment is not None
    return gw.deployment


def test_stun_mode_renders_auth_none_without_credentials(render: Render) -> None:
    cfg = render(gwconfig("stunMode: true"), UDP_GATEWAY).configs()["stunner/gw"]
    assert cfg.auth.type == "none"
    assert cfg.auth.credentials == {}
    assert cfg.auth.realm == "stunner.l7mp.io"
    assert [ls.name for ls in cfg.listeners] == ["stunner/gw/udp"]


def test_stun_mode_false_keeps_the_configured_auth(render: Render) -> None:
    cfg = render(gwconfig("stunMode: false"), UDP_GATEWAY).configs()["stunner/gw"]
    assert cfg.auth.type == "static"
    assert cfg.auth.credentials == {"username": "user-1", "password": "pass-1"}


def test_auth_lifetime_travels_with_ephemeral_credentials(render: Render) -> None:
    text = HIERARCHY.replace(
        "spec: {authType: static, userName: user-1, password: pass-1}",
        "spec: {authType: ephemeral, sharedSecret: s3cret, authLifetime: 600}",
    )
    cfg = render(text, UDP_GATEWAY).configs()["stunner/gw"]
    assert cfg.auth.type == "ephemeral"
    assert cfg.auth.credentials == {"secret": "s3cret", "lifetime": "600"}


def test_auth_lifetime_is_not_rendered_for_static_auth(render: Render) -> None:
    cfg = render(gwconfig("authLifetime: 600"), UDP_GATEWAY).configs()["stunner/gw"]
    assert "lifetime" not in cfg.auth.credentials
