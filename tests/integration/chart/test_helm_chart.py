"""The Helm chart, linted and rendered by the real Helm engine, checked object by object.

Every rendered object must be a valid Kubernetes object (built-in kinds against the generated
models, the Dataplane against the chart's own CRD), the components must find each other (Service
selectors, Redis URLs, the CDS address), the operator must get the permissions it needs, and the
arguments and environment the chart sets must be accepted by the real programs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import helm_python
import httpx
import pytest
from chart_support import (
    CHART_DIR,
    NAMESPACE,
    Rendered,
    chart_crds,
    container_env,
    custom_resource_errors,
    render,
    validate_builtin,
)

from stunner_cds.settings import CdsSettings
from stunner_common.contracts.listener_port import TargetPorts
from stunner_common.crds import Dataplane, Gateway
from stunner_operator.__main__ import _parser as operator_parser
from stunner_operator.k8s.resources import BY_KIND, WRITABLE, watched
from stunner_operator.render.dataplane import render_deployment
from stunner_operator.render.options import RenderOptions
from stunner_operator.settings import OperatorSettings
from stunnerd.cli import build_parser as stunnerd_parser
from support.ports import free_port
from support.processes import running, wait_for_tcp
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration

EXTERNAL_REDIS = "redis://redis.example.internal:6379/3"
EXTERNAL_TLS_REDIS = "rediss://stunner@redis.example.internal:6380/0"
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-redis": {"redis": {"enabled": False, "external": {"url": EXTERNAL_REDIS}}},
    "redis-url-from-secret": {
        "redis": {"enabled": False, "external": {"urlSecret": {"name": "my-redis"}}}
    },
    "external-redis-with-password": {
        "redis": {
            "enabled": False,
            "external": {"url": EXTERNAL_TLS_REDIS, "passwordSecret": {"name": "redis-pw"}},
        }
    },
    "everything-on": {
        "monitoring": {"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
        "tests": {"turncat": {"peer": "udp://10.0.0.5:9001"}},
        "auth": {"tokenSecret": {"name": "auth-token"}, "corsOrigins": "https://app.example"},
    },
    "everything-off": {
        "auth": {"enabled": False},
        "networkPolicy": {"enabled": False},
    },
    "redis-persistence": {"redis": {"persistence": {"enabled": True, "storageClass": "fast"}}},
    "one-cds-replica": {"cds": {"replicas": 1}},
    "registry-and-pull-secrets": {
        "image": {"registry": "ghcr.io/example/", "tag": "1.2.3", "pullSecrets": [{"name": "r"}]},
        "operator": {"extraArgs": ["--print"], "extraEnv": [{"name": "X", "value": "1"}]},
    },
    "no-dataplane-no-rbac": {
        "dataplane": {"enabled": False},
        "operator": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "sa"}},
    },
    "scheduling": {
        "operator": {"nodeSelector": {"role": "infra"}, "tolerations": [{"operator": "Exists"}]},
        "cds": {"affinity": {"podAntiAffinity": {}}, "priorityClassName": "high"},
        "commonLabels": {"team": "media"},
    },
}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "Dataplane", "CustomResourceDefinition"}
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render()


# --------------------------------------------------------------------------------------------
# Lint and metadata


def _problems(report: dict[str, Any]) -> list[str]:
    """Lint errors and warnings (severity 2 and 3); info messages are only advice."""
    return list(report["errors"]) + [
        f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2
    ]


@pytest.mark.parametrize("values", ["defaults", "external-redis", "redis-persistence"])
def test_chart_lints_clean_in_strict_mode(values: str) -> None:
    report = helm_python.lint(
        CHART_DIR, VALUE_SETS[values], strict=True, namespace=NAMESPACE, kube_version="v1.30.0"
    )
    assert report["total_charts_linted"] == 1
    assert _problems(report) == []


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"redis": {"enabled": False}}, "/redis"),
        ({"redsi": {"enabled": False}}, "'redsi' not allowed"),
        ({"cds": {"replicas": "two"}}, "/cds/replicas"),
    ],
)
def test_lint_reports_unusable_values_as_errors(values: dict[str, Any], where: str) -> None:
    report = helm_python.lint(CHART_DIR, values, namespace=NAMESPACE)
    assert any(where in p for p in _problems(report)), report


def test_chart_is_a_v2_application_chart_named_stunner() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        meta = chart.metadata
        templates = {t["name"] for t in chart.templates}
    assert (meta["apiVersion"], meta["name"], meta["type"]) == ("v2", "stunner", "application")
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    assert "templates/NOTES.txt" in templates


# --------------------------------------------------------------------------------------------
# Every object is a valid Kubernetes object


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_rendered_object_is_valid_against_the_kubernetes_schemas(values: str) -> None:
    rendered = render(VALUE_SETS[values])
    crds = chart_crds()
    assert rendered.objects
    errors: list[str] = []
    for obj in rendered.objects:
        assert {"apiVersion", "kind", "metadata"} <= obj.keys(), obj
        name = obj["metadata"].get("name", "")
        assert DNS1123_SUBDOMAIN.match(name), name
        assert len(name) <= 63, name
        for key, value in obj["metadata"].get("labels", {}).items():
            assert isinstance(value, str), key
            assert LABEL_VALUE.match(value), key
            assert len(value) <= 63, key
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], name
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, name
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus operator's kinds: checked in test_chart_ship.py
        if obj["apiVersion"].startswith("stunner.l7mp.io/"):
            errors += custom_resource_errors(obj, crds)
        else:
            errors += validate_builtin(obj)
    assert errors == []


def test_default_render_has_every_component(default: Rendered) -> None:
    assert default.kinds() == {
        ("ServiceAccount", "stunner-operator"),
        ("ClusterRole", "stunner-operator"),
        ("ClusterRoleBinding", "stunner-operator"),
        ("Role", "stunner-operator-leader-election"),
        ("RoleBinding", "stunner-operator-leader-election"),
        ("Deployment", "stunner-operator"),
        ("Deployment", "stunner-cds"),
        ("Service", "stunner-config-discovery"),
        ("PodDisruptionBudget", "stunner-cds"),
        ("Deployment", "stunner-redis"),
        ("Service", "stunner-redis"),
        ("Secret", "stunner-redis"),
        ("Secret", "stunner-cds-token"),
        ("Dataplane", "default"),
        ("Deployment", "stunner-auth"),
        ("Service", "stunner-auth"),
        ("NetworkPolicy", "stunner-redis"),
        ("NetworkPolicy", "stunner-cds"),
        ("Pod", "stunner-test-cds"),
        ("Secret", "stunner-quota-redis"),
    }
    assert "stunner-config-discovery" in default.notes


def test_no_object_is_rendered_twice(default: Rendered) -> None:
    keys = [(o["kind"], o["metadata"]["name"]) for o in default.objects]
    assert len(keys) == len(set(keys))


def test_deployment_selectors_match_their_pod_templates_and_nothing_else(
    default: Rendered,
) -> None:
    deployments = [o for o in default.objects if o["kind"] == "Deployment"]
    for dep in deployments:
        selector = dep["spec"]["selector"]["matchLabels"]
        for other in deployments:
            labels = other["spec"]["template"]["metadata"]["labels"]
            selected = selector.items() <= labels.items()
            assert selected == (other is dep), (dep["metadata"]["name"], other["metadata"]["name"])


def _pods_selected(rendered: Rendered, selector: dict[str, str]) -> list[str]:
    return [
        d["metadata"]["name"]
        for d in rendered.objects
        if d["kind"] == "Deployment"
        and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


# --------------------------------------------------------------------------------------------
# CDS


def test_cds_service_is_stunner_config_discovery_on_13478_in_front_of_the_cds_pods(
    default: Rendered,
) -> None:
    svc = default.get("Service", "stunner-config-discovery")
    assert [(p["port"], p["protocol"]) for p in svc["spec"]["ports"]] == [(13478, "TCP")]
    assert _pods_selected(default, svc["spec"]["selector"]) == ["stunner-cds"]
    cds = default.get("Deployment", "stunner-cds")
    container = _container(cds)
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port_names[svc["spec"]["ports"][0]["targetPort"]] == 13478
    labels = cds["spec"]["template"]["metadata"]["labels"]
    assert labels["stunner.l7mp.io/config-discovery-service"] == "enabled"
    assert svc["metadata"]["labels"]["stunner.l7mp.io/config-discovery-service"] == "enabled"


@pytest.mark.parametrize(("replicas", "with_pdb"), [(1, False), (2, True), (5, True)])
def test_cds_replicas_come_from_values(replicas: int, with_pdb: bool) -> None:
    rendered = render({"cds": {"replicas": replicas}})
    assert rendered.get("Deployment", "stunner-cds")["spec"]["replicas"] == replicas
    assert (("PodDisruptionBudget", "stunner-cds") in rendered.kinds()) == with_pdb


def test_cds_environment_is_understood_by_the_cds_settings(
    default: Rendered, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = container_env(_container(default.get("Deployment", "stunner-cds")))
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    settings = CdsSettings()
    assert (settings.host, settings.port) == ("0.0.0.0", 13478)
    # Kubernetes expands $(REDIS_PASSWORD) from the Secret before the CDS sees it.
    assert settings.redis_url == BUNDLED_URL.format(user="cds")


def test_real_cds_started_with_the_chart_environment_passes_the_chart_probes(
    default: Rendered, redis: RedisServer, tmp_path: Path
) -> None:
    container = _container(default.get("Deployment", "stunner-cds"))
    env = {k: v for k, v in container_env(container).items() if isinstance(v, str)}
    port = free_port()
    # Inside the cluster: 0.0.0.0 and the in-cluster Redis; here: loopback and a real Redis.
    env.update(CDS_HOST="127.0.0.1", CDS_PORT=str(port), REDIS_URL=redis.url)
    cds_bin = str(Path(sys.executable).with_name("stunner-cds"))
    with running([cds_bin], env=env, log_path=tmp_path / "cds.log") as proc:
        wait_for_tcp("127.0.0.1", port, timeout_s=20, proc=proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as client:
            for probe in ("livenessProbe", "readinessProbe"):
                response = client.get(container[probe]["httpGet"]["path"])
                assert response.status_code == 200, (probe, response.text, proc.output())


# --------------------------------------------------------------------------------------------
# Redis


def _redis_env(rendered: Rendered) -> list[Any]:
    return [
        container_env(_container(rendered.get("Deployment", name)))["REDIS_URL"]
        for name in ("stunner-operator", "stunner-cds")
    ]


BUNDLED_URL = "redis://stunner-{user}:$(REDIS_PASSWORD)@stunner-redis." + NAMESPACE + ".svc:6379/0"


def test_operator_and_cds_use_the_bundled_redis_service_by_default(default: Rendered) -> None:
    svc = default.get("Service", "stunner-redis")
    port = svc["spec"]["ports"][0]["port"]
    host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{port}"
    assert _redis_env(default) == [
        f"redis://stunner-{user}:$(REDIS_PASSWORD)@{host}/0" for user in ("operator", "cds")
    ]
    assert _pods_selected(default, svc["spec"]["selector"]) == ["stunner-redis"]
    redis_container = _container(default.get("Deployment", "stunner-redis"))
    assert {p["containerPort"] for p in redis_container["ports"]} == {port}


def test_external_redis_url_replaces_the_bundled_redis() -> None:
    rendered = render(VALUE_SETS["external-redis"])
    assert not any("redis" in name for _, name in rendered.kinds())
    assert _redis_env(rendered) == [EXTERNAL_REDIS, EXTERNAL_REDIS]


def test_external_redis_url_can_come_from_a_secret() -> None:
    rendered = render(VALUE_SETS["redis-url-from-secret"])
    ref = {"secretKeyRef": {"name": "my-redis", "key": "url"}}
    assert _redis_env(rendered) == [ref, ref]


def test_an_external_redis_password_secret_goes_into_the_url() -> None:
    rendered = render(VALUE_SETS["external-redis-with-password"])
    url = "rediss://stunner:$(REDIS_PASSWORD)@redis.example.internal:6380/0"
    assert _redis_env(rendered) == [url, url]
    env = container_env(_container(rendered.get("Deployment", "stunner-cds")))
    assert env["REDIS_PASSWORD"] == {"secretKeyRef": {"name": "redis-pw", "key": "password"}}


def test_persistent_redis_mounts_its_claim() -> None:
    rendered = render(VALUE_SETS["redis-persistence"])
    claim = rendered.get("PersistentVolumeClaim", "stunner-redis")
    assert claim["spec"]["storageClassName"] == "fast"
    volumes = rendered.get("Deployment", "stunner-redis")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "stunner-redis"}} in volumes


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"redis": {"enabled": False}}, "at '/redis/external': 'anyOf' failed"),
        ({"redis": {"enabled": False, "external": {"urlSecret": {"name": ""}}}}, "at '/redis"),
        (
            {"redis": {"enabled": False, "external": {"url": "http://x:6379"}}},
            "/redis/external/url",
        ),
        ({"tests": {"turncat": {"peer": "10.0.0.5:9001"}}}, "at '/tests/turncat/peer'"),
        ({"cds": {"replicas": "two"}}, "at '/cds/replicas': got string, want integer"),
        ({"cds": {"port": 70000}}, "at '/cds/port'"),
        ({"operator": {"logFormat": "xml"}}, "at '/operator/logFormat'"),
        ({"operator": {"replicaz": 2}}, "'replicaz' not allowed"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
        ({"redis": {"persistence": {"size": "lots"}}}, "at '/redis/persistence/size'"),
    ],
)
def test_values_outside_the_schema_are_refused_with_the_offending_key(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(message)):
        render(values)


def test_a_missing_service_account_name_fails_the_render_with_a_message() -> None:
    values = {"operator": {"serviceAccount": {"create": False, "name": ""}}}
    with pytest.raises(helm_python.HelmError, match=r"operator\.serviceAccount\.name must name"):
        render(values)


# --------------------------------------------------------------------------------------------
# Operator and RBAC


def _allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r.get("apiGroups", [])
        and resource in r.get("resources", [])
        and (verb in r["verbs"] or "*" in r["verbs"])
        for r in rules
    )


def _needed_by_the_operator(enforce: bool = False) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the operator's Kubernetes code uses, read from that code: it
    lists and watches what it watches (ReferenceGrants only where they are enforced),
    merge-patches the status of what it reports on, and applies (PATCH, or POST when missing)
    and deletes WRITABLE."""
    needed = set()
    for res in watched(enforce_reference_grants=enforce):
        needed |= {(res.group, res.plural, "list"), (res.group, res.plural, "watch")}
    for kind in ("GatewayClass", "Gateway", "UDPRoute", "UDPRouteV1A2"):
        res = BY_KIND[kind]
        needed.add((res.group, f"{res.plural}/status", "patch"))
    for res in WRITABLE.values():
        needed |= {(res.group, res.plural, verb) for verb in ("create", "patch", "delete")}
    return needed


def _granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_operator_cluster_role_grants_exactly_what_the_operator_code_uses(
    default: Rendered,
) -> None:
    rules = default.get("ClusterRole", "stunner-operator")["rules"]
    assert _granted(rules) == _needed_by_the_operator()


def test_enforced_reference_grants_add_exactly_their_read_to_the_cluster_role() -> None:
    rendered = render({"operator": {"enforceReferenceGrants": True}})
    rules = rendered.get("ClusterRole", "stunner-operator")["rules"]
    assert _granted(rules) == _needed_by_the_operator(enforce=True)


def test_leader_election_leases_are_granted_in_the_release_namespace(default: Rendered) -> None:
    role = default.get("Role", "stunner-operator-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    # The elector reads the Lease, creates it, and merge-patches it to renew or take it over.
    assert _granted(role["rules"]) == {
        ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "patch")
    }


def test_roles_are_bound_to_the_operator_service_account(default: Rendered) -> None:
    sa = default.get("ServiceAccount", "stunner-operator")
    pod_spec = default.get("Deployment", "stunner-operator")["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == sa["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": "stunner-operator", "namespace": NAMESPACE}
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = next(o for o in default.objects if o["kind"] == kind)
        assert binding["subjects"] == [subject]
        assert binding["roleRef"]["kind"] == role_kind
        assert (role_kind, binding["roleRef"]["name"]) in default.kinds()


def test_operator_arguments_are_accepted_by_the_operator(default: Rendered) -> None:
    container = _container(default.get("Deployment", "stunner-operator"))
    args = operator_parser().parse_args(container["args"])
    assert args.cds_address == f"stunner-config-discovery.{NAMESPACE}.svc:13478"
    assert args.log_level == "INFO"


def test_operator_environment_is_understood_by_the_operator_settings(
    default: Rendered, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = container_env(_container(default.get("Deployment", "stunner-operator")))
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    settings = OperatorSettings()
    assert settings.redis_url == BUNDLED_URL.format(user="operator")
    assert settings.controller_name == "stunner.l7mp.io/gateway-operator"
    assert settings.log_format == "text"


@pytest.mark.parametrize("enforce", [False, True])
def test_enforcing_reference_grants_reaches_the_operator_settings(
    enforce: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = render({"operator": {"enforceReferenceGrants": enforce}})
    env = container_env(_container(rendered.get("Deployment", "stunner-operator")))
    assert ("OPERATOR_ENFORCE_REFERENCE_GRANTS" in env) is enforce
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    assert OperatorSettings().enforce_reference_grants is enforce


def test_images_follow_registry_and_tag_values() -> None:
    rendered = render(VALUE_SETS["registry-and-pull-secrets"])
    images = {
        name: _container(rendered.get("Deployment", name))["image"]
        for name in ("stunner-operator", "stunner-cds")
    }
    assert images == {
        "stunner-operator": "ghcr.io/example/stunner-operator:1.2.3",
        "stunner-cds": "ghcr.io/example/stunner-cds:1.2.3",
    }
    dataplane_image = rendered.get("Dataplane", "default")["spec"]["image"]
    assert dataplane_image == "ghcr.io/example/stunner-stunnerd:1.2.3"
    operator = _container(rendered.get("Deployment", "stunner-operator"))
    assert operator["args"][-1] == "--print"
    assert container_env(operator)["X"] == "1"


def test_default_images_are_the_names_make_images_gives(default: Rendered) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        app_version = chart.metadata["appVersion"]
    sys.path.insert(0, str(CHART_DIR.parents[1] / "scripts"))
    try:
        from images import image_name  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    image = _container(default.get("Deployment", "stunner-cds"))["image"]
    assert image == image_name("cds", app_version) == f"localhost/stunner-cds:{app_version}"
    dataplane = default.get("Dataplane", "default")["spec"]["image"]
    assert dataplane == image_name("stunnerd", app_version)


# --------------------------------------------------------------------------------------------
# The default Dataplane


def test_default_dataplane_runs_stunnerd_watching_its_config(default: Rendered) -> None:
    spec = default.get("Dataplane", "default")["spec"]
    assert spec["command"] == ["stunnerd"]
    args = stunnerd_parser().parse_args(spec["args"])
    assert args.watch
    assert args.udp_thread_num >= 1
    assert spec["terminationGracePeriodSeconds"] == 3600
    assert spec["resources"]["limits"]["memory"] == "512Mi"


def test_default_dataplane_is_read_by_the_operator_model_without_unknown_fields(
    default: Rendered,
) -> None:
    dataplane = Dataplane.model_validate(default.get("Dataplane", "default"))
    assert dataplane.spec.model_extra == {}
    assert dataplane.spec.image.startswith("localhost/stunner-stunnerd:")


def test_stunnerd_deployment_from_the_default_dataplane_is_valid_and_finds_the_cds(
    default: Rendered,
) -> None:
    dataplane = Dataplane.model_validate(default.get("Dataplane", "default"))
    gateway = Gateway.model_validate(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "udp-gateway", "namespace": "stunner", "uid": "u-1"},
            "spec": {
                "gatewayClassName": "stunner-gatewayclass",
                "listeners": [{"name": "udp-listener", "port": 3478, "protocol": "TURN-UDP"}],
            },
        }
    )
    operator_args = operator_parser().parse_args(
        _container(default.get("Deployment", "stunner-operator"))["args"]
    )
    deployment = render_deployment(
        gateway, dataplane, {}, RenderOptions(cds_address=operator_args.cds_address), TargetPorts()
    )
    assert validate_builtin(deployment) == []
    container = _container(deployment)
    env = container_env(container)
    assert env["STUNNER_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["STUNNER_CONFIG_ORIGIN"] == f"http://stunner-config-discovery.{NAMESPACE}.svc:13478"
    assert container["image"] == dataplane.spec.image
    # The pods reach the Service the chart made: same name, namespace and port.
    svc = default.get("Service", "stunner-config-discovery")
    host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert env["STUNNER_CONFIG_ORIGIN"] == f"http://{host}:{svc['spec']['ports'][0]['port']}"


def test_default_dataplane_leaves_the_operator_set_environment_alone(default: Rendered) -> None:
    env = default.get("Dataplane", "default")["spec"].get("env", [])
    assert not [e for e in env if e["name"].startswith("STUNNER_")]


def test_dataplane_can_be_left_out() -> None:
    rendered = render({"dataplane": {"enabled": False}})
    assert not [o for o in rendered.objects if o["kind"] == "Dataplane"]


def test_hashed_annotations_are_quoted_so_an_all_digit_hash_stays_a_string() -> None:
    """A checksum truncated to 16 hex digits is all digits about once in 1,900 renders; unquoted,
    YAML then reads it as an integer and Kubernetes refuses the annotation."""
    hashed = [
        f"{path.name}: {line.strip()}"
        for path in sorted((CHART_DIR / "templates").glob("*.yaml"))
        for line in path.read_text().splitlines()
        if "sha256sum" in line and re.match(r"\s*[\w./-]+:\s*\{\{", line)
    ]
    assert hashed, "no hashed annotation found: the scan no longer matches the templates"
    assert [line for line in hashed if "| quote }}" not in line] == []
