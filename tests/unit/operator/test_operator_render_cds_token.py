"""The stunnerd Deployment gets the CDS bearer token from the Secret the operator is told about."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stunner_operator.__main__ import _options, _parser
from stunner_operator.render.engine import Renderer
from stunner_operator.render.options import RenderOptions
from stunner_operator.settings import OperatorSettings
from support.operator import HIERARCHY

Render = Callable[..., Renderer]

GATEWAY = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: stunner}
spec:
  gatewayClassName: stunner
  listeners: [{name: udp, port: 3478, protocol: TURN-UDP}]
"""
WITH_TOKEN = RenderOptions(cds_address="cds.stunner.svc:13478", cds_token_secret="cds-token")


def container(r: Renderer) -> dict[str, Any]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.deployment is not None
    (out,) = gw.deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(out, dict)
    return out


def with_dataplane_env(env: str) -> str:
    return HIERARCHY.replace(
        'spec: {image: "stunnerd:test"}', f'spec: {{image: "stunnerd:test", env: {env}}}'
    )


def test_the_stunnerd_container_reads_cds_token_from_the_secret(render: Render) -> None:
    assert container(render(HIERARCHY, GATEWAY, options=WITH_TOKEN))["env"] == [
        {"name": "STUNNER_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "STUNNER_NAME", "value": "gw"},
        {"name": "STUNNER_NAMESPACE", "value": "stunner"},
        {"name": "STUNNER_NODENAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "STUNNER_CONFIG_ORIGIN", "value": "http://cds.stunner.svc:13478"},
        {"name": "CDS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "cds-token", "key": "token"}}},
    ]


def test_the_key_of_the_secret_can_be_chosen(render: Render) -> None:
    options = RenderOptions(cds_token_secret="s", cds_token_key="bearer")
    env = {e["name"]: e for e in container(render(HIERARCHY, GATEWAY, options=options))["env"]}
    assert env["CDS_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "bearer"}}


def test_without_a_secret_the_pods_get_no_token(render: Render) -> None:
    names = [e["name"] for e in container(render(HIERARCHY, GATEWAY))["env"]]
    assert "CDS_TOKEN" not in names


@pytest.mark.parametrize(
    "env",
    [
        "[{name: CDS_TOKEN_FILE, value: /var/run/cds/token}]",
        "[{name: CDS_TOKEN, valueFrom: {secretKeyRef: {name: other, key: t}}}]",
    ],
)
def test_a_dataplane_that_brings_its_own_token_keeps_it(render: Render, env: str) -> None:
    names = [
        e["name"]
        for e in container(render(with_dataplane_env(env), GATEWAY, options=WITH_TOKEN))["env"]
    ]
    assert names.count("CDS_TOKEN") + names.count("CDS_TOKEN_FILE") == 1


def test_the_operator_flag_and_environment_reach_the_render_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPERATOR_CDS_TOKEN_SECRET_KEY", "k")
    args = _parser().parse_args(["--cds-token-secret", "from-flag"])
    options = _options(OperatorSettings(cds_token_secret=args.cds_token_secret))
    assert (options.cds_token_secret, options.cds_token_key) == ("from-flag", "k")
    monkeypatch.setenv("OPERATOR_CDS_TOKEN_SECRET", "from-env")
    assert _options(OperatorSettings()).cds_token_secret == "from-env"
