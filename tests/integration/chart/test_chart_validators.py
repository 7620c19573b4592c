"""The chart checks themselves: each one refuses the mistakes it exists to catch.

A validator that accepts everything would make the chart tests pass whatever the chart says, so
every kind of mistake is fed to it once here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from chart_support import (
    CHART_DIR,
    chart_crds,
    load_documents,
    render,
    required_fields,
    schema_errors,
    structural_problems,
    validate_builtin,
    with_defaults,
)
from kubernetes_asyncio.client import models as k8s_models

pytestmark = pytest.mark.integration

GOOD_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: n}
spec:
  replicas: 1
  selector: {matchLabels: {app: a}}
  template:
    metadata: {labels: {app: a}}
    spec:
      containers:
        - name: c
          image: i
          ports: [{containerPort: 80, name: http}]
          env: [{name: A, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
          readinessProbe: {httpGet: {path: /, port: http}}
"""


def _mutated(path: str, value: Any) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(GOOD_DEPLOYMENT)
    *parents, last = path.split(".")
    node: Any = obj
    for step in parents:
        node = node[int(step)] if step.isdigit() else node[step]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return obj


_DELETE = object()


def test_a_correct_deployment_passes() -> None:
    assert validate_builtin(yaml.safe_load(GOOD_DEPLOYMENT)) == []


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        ("spec.replica", 1, "spec.replica: unknown field of V1DeploymentSpec"),
        ("spec.replicas", "1", "spec.replicas: expected int"),
        ("spec.selector", _DELETE, "spec.selector: required field"),
        ("spec.template.spec.containers.0.name", _DELETE, "containers[0].name: required"),
        ("spec.template.spec.containers.0.imagePullPolicy", ["Always"], "expected str"),
        ("spec.template.spec.containers.0.ports.0.containerPort", "80", "expected int"),
        ("spec.template.spec.containers.0.env.0.valueFrom.fieldRef.path", "x", "unknown field"),
        ("spec.template.spec.hostNetwork", "true", "expected bool"),
        ("spec.template.metadata.labels", ["app=a"], "expected a map"),
        ("spec.template.spec.containers", {"name": "c"}, "expected a list"),
    ],
)
def test_a_wrong_deployment_is_refused_naming_the_field(
    path: str, value: Any, fragment: str
) -> None:
    errors = validate_builtin(_mutated(path, value))
    assert any(fragment in e for e in errors), errors


def test_required_fields_are_read_from_the_generated_models() -> None:
    assert required_fields(k8s_models.V1Container) == {"name"}
    assert required_fields(k8s_models.V1DeploymentSpec) == {"selector", "template"}
    assert required_fields(k8s_models.V1ServicePort) == {"port"}
    assert "verbs" in required_fields(k8s_models.V1PolicyRule)


def test_duplicate_keys_in_rendered_yaml_are_refused() -> None:
    with pytest.raises(yaml.YAMLError, match="duplicate key 'app'"):
        load_documents("metadata:\n  labels:\n    app: a\n    app: b\n")


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$", "default": "x"},
        "port": {"type": "integer", "format": "int32", "minimum": 1},
        "size": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}]},
        "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["port"],
}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"port": 1, "nmae": "a"}, 'unknown field "nmae"'),
        ({}, ".port: required"),
        ({"port": 0}, "less than 1"),
        ({"port": 2**31}, "overflows int32"),
        ({"port": True}, "expected integer"),
        ({"port": 1, "name": "A"}, "does not match"),
        ({"port": 1, "size": 1.5}, "integer or a string"),
        ({"port": 1, "tags": ["a", "b", "c"]}, "more than 2"),
        ({"port": 1, "tags": [1]}, "expected string"),
        ({"port": 1, "name": None}, "null is not allowed"),
    ],
)
def test_the_crd_schema_check_refuses_what_an_api_server_would(
    value: dict[str, Any], fragment: str
) -> None:
    errors = list(schema_errors(value, SCHEMA))
    assert any(fragment in e for e in errors), errors


def test_the_crd_schema_check_accepts_open_objects_and_int_or_string() -> None:
    value = {"port": 1, "size": "10Gi", "open": {"any": {"thing": 1}}, "tags": ["a"]}
    assert list(schema_errors(value, SCHEMA)) == []
    assert with_defaults(value, SCHEMA)["name"] == "x"


def test_a_schema_node_without_type_or_with_a_bad_default_is_not_structural() -> None:
    bad = {
        "type": "object",
        "properties": {"a": {"description": "no type"}, "b": {"type": "integer", "default": "1"}},
    }
    problems = list(structural_problems(bad))
    assert any(".a: no type" in p for p in problems), problems
    assert any("default is invalid" in p for p in problems), problems


def test_packaged_chart_carries_the_crds_and_renders_the_same(tmp_path: Path) -> None:
    archive = helm_python.package(CHART_DIR, destination=tmp_path)
    with helm_python.Chart.load(archive) as chart:
        names = sorted(yaml.safe_load(c["data"])["metadata"]["name"] for c in chart.crds)
        packaged = chart.render(name="stunner", namespace="stunner-system", is_install=True)
    assert names == sorted(c["metadata"]["name"] for c in chart_crds())
    from_dir = render()
    assert sorted(packaged) == sorted([*from_dir.by_template, "stunner/templates/NOTES.txt"])
