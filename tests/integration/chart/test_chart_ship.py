"""The chart's delivery hardening: probes and restricted security contexts on every container,
Redis passwords and least-privilege users (checked against a real redis-server), NetworkPolicies
that admit exactly the right pods, the auth service, monitoring, Gateway API CRDs, `helm test`.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from chart_support import NAMESPACE, Rendered, container_env, render
from redis.exceptions import NoPermissionError

from stunner_auth.settings import AuthSettings
from stunner_common.contracts.listener_port import TargetPorts
from stunner_common.crds import Dataplane, Gateway
from stunner_common.io.store import ConfigPublisher, ConfigReader
from stunner_common.redis_acl import CDS_USER, DATAPLANE_USER, OPERATOR_USER, acl_config
from stunner_operator.render.dataplane import render_deployment
from stunner_operator.render.options import RenderOptions
from stunnerd.quota import ClusterQuota, QuotaSettings
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, wait_for_tcp
from support.redis_server import redis_server_binary
from turncat.cli import build_parser as turncat_parser

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
EVERYTHING = {
    "monitoring": {"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
    "tests": {"turncat": {"peer": "udp://10.0.0.5:9001"}},
    "auth": {"tokenSecret": {"name": "auth-token"}},
}


@pytest.fixture(scope="module")
def everything() -> Rendered:
    return render(EVERYTHING)


def _pods(rendered: Rendered) -> list[tuple[str, dict[str, Any]]]:
    pods = [
        (o["metadata"]["name"], o["spec"]["template"]["spec"])
        for o in rendered.objects
        if o["kind"] == "Deployment"
    ]
    pods += [(o["metadata"]["name"], o["spec"]) for o in rendered.objects if o["kind"] == "Pod"]
    return pods


def test_every_container_is_probed_and_runs_restricted(everything: Rendered) -> None:
    problems = []
    for name, pod in _pods(everything):
        pod_ctx = pod.get("securityContext", {})
        for container in pod["containers"]:
            ctx = container.get("securityContext", {})
            where = f"{name}/{container['name']}"
            is_test = name.startswith("stunner-test-")
            if not is_test and not ("livenessProbe" in container and "readinessProbe" in container):
                problems.append(f"{where}: no liveness and readiness probes")
            if not (ctx.get("runAsNonRoot") or pod_ctx.get("runAsNonRoot")):
                problems.append(f"{where}: may run as root")
            if not ctx.get("readOnlyRootFilesystem"):
                problems.append(f"{where}: writable root filesystem")
            seccomp = ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}
            if seccomp.get("type") != "RuntimeDefault":
                problems.append(f"{where}: no RuntimeDefault seccomp profile")
            caps = ctx.get("capabilities", {})
            if caps.get("drop") != ["ALL"] or caps.get("add"):
                problems.append(f"{where}: capabilities {caps}")
            if ctx.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: privilege escalation allowed")
    assert problems == []


def test_the_dataplane_pods_the_operator_builds_run_restricted_with_a_writable_tmpdir(
    everything: Rendered,
) -> None:
    dataplane = Dataplane.model_validate(everything.get("Dataplane", "default"))
    gateway = Gateway.model_validate(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "team", "uid": "1"},
            "spec": {"gatewayClassName": "c", "listeners": []},
        }
    )
    deployment = render_deployment(gateway, dataplane, {}, RenderOptions(), TargetPorts())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["runAsNonRoot"] is True
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert container_env(container)["TMPDIR"] == "/dev/shm"
    assert {"livenessProbe", "readinessProbe"} <= container.keys()


def test_the_operator_probes_and_metrics_use_the_spec_ports(everything: Rendered) -> None:
    container = everything.get("Deployment", "stunner-operator")["spec"]["template"]["spec"][
        "containers"
    ][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8081, "metrics": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


# --------------------------------------------------------------------------------------------
# Redis


def _acl(rendered: Rendered) -> tuple[str, dict[str, str]]:
    data = rendered.get("Secret", "stunner-redis")["stringData"]
    passwords = {
        OPERATOR_USER: data["operator-password"],
        CDS_USER: data["cds-password"],
        DATAPLANE_USER: data["dataplane-password"],
    }
    return data["users.acl"], passwords


def test_the_redis_acl_file_is_the_one_the_library_defines_with_fresh_passwords() -> None:
    first, second = render(), render()
    text, passwords = _acl(first)
    assert text == acl_config(passwords)
    assert all(re.fullmatch(r"[A-Za-z0-9]{32}", p) for p in passwords.values())
    assert _acl(second)[1] != passwords
    redis = first.get("Deployment", "stunner-redis")["spec"]["template"]["spec"]
    assert redis["containers"][0]["args"][:2] == ["--aclfile", "/etc/redis/users.acl"]
    assert {"name": "acl", "mountPath": "/etc/redis", "readOnly": True} in redis["containers"][0][
        "volumeMounts"
    ]


@pytest.fixture
async def chart_redis(tmp_path: Path) -> AsyncIterator[tuple[Rendered, int]]:
    """A real redis-server started as the chart starts it: with the rendered ACL file."""
    rendered = render()
    text, _ = _acl(rendered)
    (tmp_path / "users.acl").write_text(text)
    port = free_port()
    args = rendered.get("Deployment", "stunner-redis")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    args = [a.replace("/etc/redis", str(tmp_path)).replace("/data", str(tmp_path)) for a in args]
    proc = ServerProcess(
        [redis_server_binary(), *args, "--port", str(port), "--bind", LOOPBACK, "--save", ""],
        cwd=tmp_path,
        log_path=tmp_path / "redis.log",
    )
    try:
        wait_for_tcp(LOOPBACK, port, proc=proc)
        yield rendered, port
    finally:
        proc.stop()


def _url_for(rendered: Rendered, deployment: str, port: int) -> str:
    """REDIS_URL as Kubernetes expands it in `deployment`, pointed at the local redis-server."""
    env = container_env(
        rendered.get("Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    )
    key = env["REDIS_PASSWORD"]["secretKeyRef"]["key"]
    password = rendered.get("Secret", "stunner-redis")["stringData"][key]
    url = env["REDIS_URL"].replace("$(REDIS_PASSWORD)", password)
    return re.sub(r"@[^/]+/", f"@{LOOPBACK}:{port}/", url)


async def test_with_the_chart_acl_the_operator_publishes_and_the_cds_only_reads(
    chart_redis: tuple[Rendered, int],
) -> None:
    rendered, port = chart_redis
    operator = aioredis.Redis.from_url(_url_for(rendered, "stunner-operator", port))
    cds = aioredis.Redis.from_url(_url_for(rendered, "stunner-cds", port))
    try:
        config = {
            "version": "v1",
            "admin": {"name": "a/b"},
            "auth": {"type": "ephemeral", "credentials": {"secret": "s"}},
        }
        await ConfigPublisher(operator).upsert("a/b", config)
        assert set((await ConfigReader(cds).load_snapshot()).configs) == {"a/b"}
        with pytest.raises(NoPermissionError):
            await ConfigPublisher(cds).upsert("a/c", config)
        with pytest.raises(NoPermissionError):
            await cds.hset("stunner:configs", "a/b", "{}")
    finally:
        await operator.aclose()
        await cds.aclose()


async def test_with_the_chart_acl_stunnerd_counts_its_quota_and_reads_nothing_else(
    chart_redis: tuple[Rendered, int],
) -> None:
    rendered, port = chart_redis
    secret = rendered.get("Secret", "stunner-quota-redis")
    assert secret["metadata"]["namespace"] == NAMESPACE
    url = re.sub(r"@[^/]+/", f"@{LOOPBACK}:{port}/", secret["stringData"]["url"])
    operator_env = container_env(
        rendered.get("Deployment", "stunner-operator")["spec"]["template"]["spec"]["containers"][0]
    )
    assert operator_env["OPERATOR_QUOTA_REDIS_SECRET"] == "stunner-quota-redis"
    quota = ClusterQuota(QuotaSettings(url, timeout_s=2.0))
    quota.configure("ns/gw", "realm", 1)
    dataplane = aioredis.Redis.from_url(url)
    try:
        assert await quota.acquire("user", "lease-1", 600.0)
        assert not await quota.acquire("user", "lease-2", 600.0)  # the quota of 1 holds
        assert quota.status()["mode"] == "cluster"
        with pytest.raises(NoPermissionError):
            await dataplane.hgetall("stunner:configs")
        with pytest.raises(NoPermissionError):
            await dataplane.zadd("stunner:other", {"x": 1})
    finally:
        await quota.close()
        await dataplane.aclose()


def test_the_cluster_wide_quota_can_be_turned_off_and_needs_the_charts_redis() -> None:
    for values in (
        {"dataplane": {"clusterWideQuota": False}},
        {"redis": {"enabled": False, "external": {"url": "redis://r:6379/0"}}},
    ):
        rendered = render(values)
        assert ("Secret", "stunner-quota-redis") not in rendered.kinds()
        env = container_env(
            rendered.get("Deployment", "stunner-operator")["spec"]["template"]["spec"][
                "containers"
            ][0]
        )
        assert "OPERATOR_QUOTA_REDIS_SECRET" not in env


# --------------------------------------------------------------------------------------------
# NetworkPolicies


def _labels(rendered: Rendered, deployment: str) -> dict[str, str]:
    labels: dict[str, str] = rendered.get("Deployment", deployment)["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


def _admitted(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    return any(
        "podSelector" in peer and peer["podSelector"]["matchLabels"].items() <= labels.items()
        for rule in policy["spec"]["ingress"]
        for peer in rule["from"]
    )


def test_redis_is_reachable_only_from_the_operator_and_the_cds(everything: Rendered) -> None:
    policy = everything.get("NetworkPolicy", "stunner-redis")
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        <= _labels(everything, "stunner-redis").items()
    )
    admitted = {
        name
        for name in ("stunner-operator", "stunner-cds", "stunner-auth", "stunner-redis")
        if _admitted(policy, _labels(everything, name))
    }
    assert admitted == {"stunner-operator", "stunner-cds"}


def test_the_cds_is_reachable_from_dataplane_pods_the_operator_and_the_auth_service(
    everything: Rendered,
) -> None:
    policy = everything.get("NetworkPolicy", "stunner-cds")
    admitted = {
        name
        for name in ("stunner-operator", "stunner-cds", "stunner-auth", "stunner-redis")
        if _admitted(policy, _labels(everything, name))
    }
    assert admitted == {"stunner-operator", "stunner-auth"}
    dataplane = Dataplane.model_validate(everything.get("Dataplane", "default"))
    gateway = Gateway.model_validate(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "team", "uid": "1"},
            "spec": {"gatewayClassName": "c", "listeners": []},
        }
    )
    deployment = render_deployment(gateway, dataplane, {}, RenderOptions(), TargetPorts())
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    dataplane_peer = next(
        p for p in policy["spec"]["ingress"][0]["from"] if "namespaceSelector" in p
    )
    # Only the namespaces Gateways live in: the release's and cds.token.gatewayNamespaces.
    assert dataplane_peer["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [NAMESPACE]}
        ]
    }
    more = render({"cds": {"token": {"gatewayNamespaces": ["team", NAMESPACE]}}})
    more_peer = next(
        p
        for p in more.get("NetworkPolicy", "stunner-cds")["spec"]["ingress"][0]["from"]
        if "namespaceSelector" in p
    )
    assert more_peer["namespaceSelector"]["matchExpressions"][0]["values"] == [NAMESPACE, "team"]
    assert dataplane_peer["podSelector"]["matchLabels"].items() <= pod_labels.items()
    for name in ("stunner-test-turncat", "stunner-test-cds"):
        test_pod = everything.get("Pod", name)["metadata"]["labels"]
        assert dataplane_peer["podSelector"]["matchLabels"].items() <= test_pod.items()


def test_helm_test_checks_the_cds_by_default_and_stunnerctl_reads_its_command(
    everything: Rendered,
) -> None:
    pod = everything.get("Pod", "stunner-test-cds")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["stunnerctl", "config"]
    env = container_env(container)
    assert env["CDS_SERVER_ADDR"] == f"stunner-config-discovery.{NAMESPACE}.svc:13478"
    assert "CDS_TOKEN" in env
    assert ("Pod", "stunner-test-cds") not in render({"tests": {"cds": {"enabled": False}}}).kinds()


def test_the_cds_can_be_opened_and_policies_turned_off() -> None:
    opened = render({"networkPolicy": {"cds": {"allowAll": True}}})
    assert ("NetworkPolicy", "stunner-cds") not in opened.kinds()
    assert ("NetworkPolicy", "stunner-redis") in opened.kinds()
    extra = {"namespaceSelector": {"matchLabels": {"name": "tools"}}}
    widened = render({"networkPolicy": {"cds": {"extraFrom": [extra]}}})
    assert extra in widened.get("NetworkPolicy", "stunner-cds")["spec"]["ingress"][0]["from"]
    off = render({"networkPolicy": {"enabled": False}})
    assert not any(kind == "NetworkPolicy" for kind, _ in off.kinds())


# --------------------------------------------------------------------------------------------
# Auth service, monitoring, CRDs, helm test


def test_the_auth_service_environment_is_understood_and_points_at_the_cds(
    everything: Rendered, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = everything.get("Deployment", "stunner-auth")["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = container_env(container)
    assert env["AUTH_TOKEN"] == {"secretKeyRef": {"name": "auth-token", "key": "token"}}
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    settings = AuthSettings()
    assert settings.port == 8088
    assert settings.cds_url == f"http://stunner-config-discovery.{NAMESPACE}.svc:13478"
    service = everything.get("Service", "stunner-auth")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(8088, "http")]
    assert service["spec"]["selector"].items() <= _labels(everything, "stunner-auth").items()


def test_monitoring_scrapes_the_operator_the_cds_and_the_dataplane(everything: Rendered) -> None:
    monitor = everything.get("ServiceMonitor", "stunner")
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"metrics", "cds"}
    metrics_svc = everything.get("Service", "stunner-operator-metrics")
    assert (
        metrics_svc["spec"]["selector"].items() <= _labels(everything, "stunner-operator").items()
    )
    pods = everything.get("PodMonitor", "stunner-dataplane")
    assert pods["spec"]["podMetricsEndpoints"][0]["port"] == "metrics-port"


def test_the_grafana_dashboard_queries_metrics_the_services_export(everything: Rendered) -> None:
    config_map = everything.get("ConfigMap", "stunner-grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["stunner.json"])
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    names = {
        re.sub(r"_(total|bucket)$", "", m) for e in exprs for m in re.findall(r"stunner_\w+", e)
    }
    sources = "".join(p.read_text() for p in (ROOT / "services").glob("*/src/**/*.py"))
    assert sorted(n for n in names if f'"{n}"' not in sources) == []


def test_the_chart_installs_no_gateway_api_crds_and_says_how_to_get_the_official_ones(
    everything: Rendered,
) -> None:
    # Copies under the official names would fight a cluster's own Gateway API release.
    assert not [o for o in everything.objects if o["kind"] == "CustomResourceDefinition"]
    assert "gateway-api/releases/download" in everything.notes
    with pytest.raises(Exception, match="does not install the Gateway API CRDs"):
        render({"gatewayAPI": {"installCRDs": True}})


def test_an_empty_image_registry_fails_the_install_with_what_to_do() -> None:
    # A bare name would be pulled from a public registry, where these images do not exist.
    with pytest.raises(Exception, match=r"image.registry is empty.*make images"):
        render({"image": {"registry": ""}})


def test_helm_test_relays_one_line_with_turncat_arguments_turncat_accepts(
    everything: Rendered,
) -> None:
    pod = everything.get("Pod", "stunner-test-turncat")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = pod["spec"]["containers"][0]
    env = container_env(container)
    script = container["args"][0]
    assert 'test "$reply" = stunner-helm-test' in script
    argv = ["--cds-server-address", env["CDS_SERVER_ADDR"], "-", env["TURN_SERVER"], env["PEER"]]
    args = turncat_parser().parse_args(argv)
    assert (args.local, args.peer) == ("-", "udp://10.0.0.5:9001")
    assert env["TURN_SERVER"] == "k8s://stunner/udp-gateway:udp-listener"
    assert ("Pod", "stunner-test-turncat") not in render().kinds()
