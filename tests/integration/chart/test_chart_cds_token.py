"""One CDS bearer token for the whole release, from one Secret, rendered by the real Helm engine.

The chart generates the token into the Secret "stunner-cds-token" (or names an existing one),
and every party gets it from there: the CDS requires it, the auth service and the `helm test`
pod send it, and the operator is told the Secret so that the stunnerd Deployments it renders
read ``CDS_TOKEN`` from it. The Secret references are resolved here the way the kubelet does,
and a real CDS started with the chart's environment refuses a client without the token and
serves the one the stunnerd pods would send.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import httpx
import pytest
from chart_support import NAMESPACE, Rendered, container_env, render, validate_builtin

from stunner_cds.settings import CdsSettings
from stunner_common.contracts.listener_port import TargetPorts
from stunner_common.crds import Dataplane, Gateway
from stunner_common.io.cds.token import token_source
from stunner_operator.__main__ import _options as operator_options
from stunner_operator.__main__ import _parser as operator_parser
from stunner_operator.render.dataplane import render_deployment
from stunner_operator.settings import OperatorSettings
from support.ports import free_port
from support.processes import running, wait_for_tcp
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration

SECRET = "stunner-cds-token"
S = TypeVar("S")
GATEWAY: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "Gateway",
    "metadata": {"name": "udp-gateway", "namespace": NAMESPACE, "uid": "u-1"},
    "spec": {
        "gatewayClassName": "stunner-gatewayclass",
        "listeners": [{"name": "udp-listener", "port": 3478, "protocol": "TURN-UDP"}],
    },
}


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render()


def _container(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    containers: list[dict[str, Any]] = spec["containers"]
    return containers[0]


def _secrets(rendered: Rendered, namespace: str) -> dict[tuple[str, str], str]:
    """``(secret, key) -> value`` of the Secrets the release puts in ``namespace``."""
    out = {}
    for obj in rendered.objects:
        if obj["kind"] == "Secret" and obj["metadata"]["namespace"] == namespace:
            for key, value in obj.get("stringData", {}).items():
                out[obj["metadata"]["name"], key] = value
    return out


def _resolved(env: Mapping[str, Any], secrets: Mapping[tuple[str, str], str]) -> dict[str, str]:
    """The environment as the kubelet hands it over: secretKeyRefs replaced by their values."""
    out = {}
    for name, value in env.items():
        if isinstance(value, str):
            out[name] = value
        elif "secretKeyRef" in value:
            ref = value["secretKeyRef"]
            out[name] = secrets[ref["name"], ref["key"]]
    return out


def _settings(cls: type[S], env: Mapping[str, Any], **flags: Any) -> S:
    """Settings built as the program builds them, from the container's environment."""
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    with mock.patch.dict(os.environ, plain):
        return cls(**flags)


def _stunnerd(rendered: Rendered, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The stunnerd Deployment the operator renders from the chart's Dataplane and settings."""
    container = _container(rendered.get("Deployment", "stunner-operator"))
    args = operator_parser().parse_args(container["args"])
    settings = _settings(OperatorSettings, container_env(container), cds_address=args.cds_address)
    gateway = Gateway.model_validate(
        {**GATEWAY, "metadata": {**GATEWAY["metadata"], "namespace": namespace}}
    )
    dataplane = Dataplane.model_validate(rendered.get("Dataplane", "default"))
    return render_deployment(gateway, dataplane, {}, operator_options(settings), TargetPorts())


def _token_users(rendered: Rendered) -> Iterator[tuple[str, dict[str, Any]]]:
    """The CDS and every client of it the release runs, with their environment."""
    for who, kind, name in (
        ("cds", "Deployment", "stunner-cds"),
        ("auth", "Deployment", "stunner-auth"),
        ("helm test", "Pod", "stunner-test-turncat"),
    ):
        yield who, container_env(_container(rendered.get(kind, name)))
    yield "stunnerd", container_env(_container(_stunnerd(rendered)))


def test_one_generated_secret_gives_the_cds_and_all_its_clients_the_same_token() -> None:
    rendered = render({"tests": {"turncat": {"peer": "udp://10.0.0.5:9001"}}})
    secret = rendered.get("Secret", SECRET)
    assert secret["metadata"]["namespace"] == NAMESPACE
    token = secret["stringData"]["token"]
    assert len(token) == 48
    assert token.isalnum()
    secrets = _secrets(rendered, NAMESPACE)
    for who, env in _token_users(rendered):
        assert env["CDS_TOKEN"] == {"secretKeyRef": {"name": SECRET, "key": "token"}}, who
        assert _resolved(env, secrets)["CDS_TOKEN"] == token, who
    # What each program makes of that environment.
    cds_env = container_env(_container(rendered.get("Deployment", "stunner-cds")))
    cds = _settings(CdsSettings, _resolved(cds_env, secrets))
    assert cds.token is not None
    assert cds.token.get_secret_value() == token
    stunnerd_env = _resolved(container_env(_container(_stunnerd(rendered))), secrets)
    source = token_source(stunnerd_env, None)
    assert source is not None
    assert source.current() == token


def test_the_stunnerd_deployment_with_the_token_is_a_valid_deployment(default: Rendered) -> None:
    deployment = _stunnerd(default)
    assert validate_builtin(deployment) == []
    names = [e["name"] for e in _container(deployment)["env"]]
    assert names.count("CDS_TOKEN") == 1
    assert "CDS_TOKEN_FILE" not in names


def test_each_install_generates_its_own_token() -> None:
    assert (
        render().get("Secret", SECRET)["stringData"]["token"]
        != render().get("Secret", SECRET)["stringData"]["token"]
    )


def test_an_existing_secret_is_named_everywhere_and_none_is_generated() -> None:
    rendered = render(
        {
            "cds": {"token": {"existingSecret": {"name": "mine", "key": "t"}}},
            "tests": {"turncat": {"peer": "udp://10.0.0.5:9001"}},
        }
    )
    assert ("Secret", SECRET) not in rendered.kinds()
    for who, env in _token_users(rendered):
        assert env["CDS_TOKEN"] == {"secretKeyRef": {"name": "mine", "key": "t"}}, who


def test_gateway_namespaces_get_a_copy_of_the_secret_their_stunnerd_pods_read() -> None:
    rendered = render({"cds": {"token": {"gatewayNamespaces": ["stunner", NAMESPACE, "media"]}}})
    copies = [
        o for o in rendered.objects if o["kind"] == "Secret" and o["metadata"]["name"] == SECRET
    ]
    assert sorted(o["metadata"]["namespace"] for o in copies) == sorted(
        [NAMESPACE, "stunner", "media"]
    )
    assert len({o["stringData"]["token"] for o in copies}) == 1
    for namespace in ("stunner", "media"):
        env = container_env(_container(_stunnerd(rendered, namespace)))
        assert (
            _resolved(env, _secrets(rendered, namespace))["CDS_TOKEN"]
            == (copies[0]["stringData"]["token"])
        )


def test_with_the_token_off_nobody_gets_one() -> None:
    rendered = render(
        {"cds": {"token": {"enabled": False}}, "tests": {"turncat": {"peer": "udp://10.0.0.5:9"}}}
    )
    assert ("Secret", SECRET) not in rendered.kinds()
    for who, env in _token_users(rendered):
        assert "CDS_TOKEN" not in env, who
    operator_env = container_env(_container(rendered.get("Deployment", "stunner-operator")))
    assert "OPERATOR_CDS_TOKEN_SECRET" not in operator_env


def test_a_real_cds_with_the_chart_token_refuses_strangers_and_serves_the_stunnerd_pods(
    default: Rendered, redis: RedisServer, tmp_path: Path
) -> None:
    secrets = _secrets(default, NAMESPACE)
    env = _resolved(container_env(_container(default.get("Deployment", "stunner-cds"))), secrets)
    stunnerd_env = _resolved(container_env(_container(_stunnerd(default))), secrets)
    port = free_port()
    # Inside the cluster: 0.0.0.0 and the in-cluster Redis; here: loopback and a real Redis.
    env.update(CDS_HOST="127.0.0.1", CDS_PORT=str(port), REDIS_URL=redis.url)
    cds_bin = str(Path(sys.executable).with_name("stunner-cds"))
    with running([cds_bin], env=env, log_path=tmp_path / "cds.log") as proc:
        wait_for_tcp("127.0.0.1", port, timeout_s=20, proc=proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as client:
            refused = client.get("/api/v1/configs")
            assert refused.status_code == 401, refused.text
            served = client.get(
                "/api/v1/configs",
                headers={"Authorization": f"Bearer {stunnerd_env['CDS_TOKEN']}"},
            )
            assert served.status_code == 200, (served.text, proc.output())
