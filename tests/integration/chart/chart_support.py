"""Checks for the Helm chart: render it with the real Helm engine, and validate what comes out.

Helm renders offline through ``helm_python`` (libhelm_c, Helm 4's own engine). No cluster is at
hand, so the objects are checked the way an API server would check them, as far as that can be
done without one:
- built-in kinds are walked against the generated ``kubernetes_asyncio`` models (field names,
  value types, required fields), which come from the Kubernetes OpenAPI definitions;
- custom resources are validated against the chart's own CRD ``openAPIV3Schema`` with the
  structural-schema rules (types, enums, patterns, bounds, required fields, defaults), and an
  unknown field is an error, as with ``kubectl apply --validate=strict``.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.client import models as k8s_models

# The chart tests import these from here.
from support.chart import CHART_DIR as CHART_DIR
from support.chart import NAMESPACE as NAMESPACE
from support.chart import RELEASE as RELEASE
from support.chart import Rendered as Rendered
from support.chart import chart_crds as chart_crds
from support.chart import load_documents as load_documents
from support.chart import render as render


def container_env(container: Mapping[str, Any]) -> dict[str, Any]:
    """``env`` of a container as name -> value (or the valueFrom mapping)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# --------------------------------------------------------------------------------------------
# Built-in kinds against the kubernetes_asyncio models

_NO_VALIDATION = Configuration()
_NO_VALIDATION.client_side_validation = False
_CHECKING = Configuration()
_CHECKING.client_side_validation = True
_LIST_RE = re.compile(r"^list\[(.+)\]$")
_DICT_RE = re.compile(r"^dict\(str, (.+)\)$")
_REQUIRED_CACHE: dict[type, frozenset[str]] = {}


def model_class(api_version: str, kind: str) -> type:
    """The generated model of a built-in kind: ``apps/v1`` + ``Deployment`` -> V1Deployment."""
    version = api_version.rsplit("/", 1)[-1]
    name = version[0].upper() + version[1:] + kind
    cls = getattr(k8s_models, name, None)
    assert isinstance(cls, type), f"no Kubernetes model for {api_version} {kind} ({name})"
    return cls


def required_fields(cls: type) -> frozenset[str]:
    """Attributes whose generated setter refuses None: the fields the API marks required."""
    if cls not in _REQUIRED_CACHE:
        probe = cls(local_vars_configuration=_NO_VALIDATION)
        probe.local_vars_configuration = _CHECKING
        required = set()
        for attr in cls.openapi_types:  # type: ignore[attr-defined]
            try:
                setattr(probe, attr, None)
            except ValueError:
                required.add(attr)
        _REQUIRED_CACHE[cls] = frozenset(required)
    return _REQUIRED_CACHE[cls]


def k8s_errors(value: Any, type_name: str, path: str = "") -> Iterator[str]:
    """Mismatches between ``value`` (plain JSON-like data) and the model type ``type_name``."""
    if type_name == "object":
        return
    if value is None:
        yield f"{path}: null"
        return
    if m := _LIST_RE.match(type_name):
        if not isinstance(value, list):
            yield f"{path}: expected a list, got {type(value).__name__}"
            return
        for i, item in enumerate(value):
            yield from k8s_errors(item, m.group(1), f"{path}[{i}]")
        return
    if m := _DICT_RE.match(type_name):
        if not isinstance(value, dict):
            yield f"{path}: expected a map, got {type(value).__name__}"
            return
        for key, item in value.items():
            if not isinstance(key, str):
                yield f"{path}: map key {key!r} is not a string"
            yield from k8s_errors(item, m.group(1), f"{path}.{key}")
        return
    scalar_ok = {
        "str": lambda v: isinstance(v, str),
        "datetime": lambda v: isinstance(v, str),
        "date": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
    }
    if type_name in scalar_ok:
        if not scalar_ok[type_name](value):
            yield f"{path}: expected {type_name}, got {type(value).__name__} {value!r}"
        return
    cls = getattr(k8s_models, type_name, None)
    assert isinstance(cls, type), f"unknown model type {type_name}"
    if not isinstance(value, dict):
        yield f"{path}: expected a {type_name} object, got {type(value).__name__}"
        return
    json_to_attr = {v: k for k, v in cls.attribute_map.items()}  # type: ignore[attr-defined]
    for key, item in value.items():
        attr = json_to_attr.get(key)
        if attr is None:
            yield f"{path}.{key}: unknown field of {type_name}"
            continue
        yield from k8s_errors(item, cls.openapi_types[attr], f"{path}.{key}")  # type: ignore[attr-defined]
    for attr in sorted(required_fields(cls)):
        json_name = cls.attribute_map[attr]  # type: ignore[attr-defined]
        if value.get(json_name) is None:
            yield f"{path}.{json_name}: required field of {type_name} missing"


def validate_builtin(obj: Mapping[str, Any]) -> list[str]:
    cls = model_class(obj["apiVersion"], obj["kind"])
    return list(k8s_errors(dict(obj), cls.__name__, f"{obj['kind']}/{obj['metadata']['name']}"))


# --------------------------------------------------------------------------------------------
# Custom resources against a CRD's openAPIV3Schema (structural schema semantics)

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _type_ok(value: Any, type_name: str) -> bool:
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
    }[type_name]


def schema_errors(value: Any, schema: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """What an API server with strict field validation would refuse in ``value``."""
    if value is None:
        if not schema.get("nullable", False):
            yield f"{path}: null is not allowed"
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not (_type_ok(value, "integer") or _type_ok(value, "string")):
            yield f"{path}: expected an integer or a string, got {value!r}"
            return
    elif "type" in schema and not _type_ok(value, schema["type"]):
        yield f"{path}: expected {schema['type']}, got {type(value).__name__} {value!r}"
        return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{path}: {value!r} is not one of {schema['enum']}"
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f"{path}: {value!r} does not match {schema['pattern']}"
        if len(value) < schema.get("minLength", 0):
            yield f"{path}: {value!r} is shorter than {schema['minLength']}"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield f"{path}: {value!r} is longer than {schema['maxLength']}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{path}: {value} is less than {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{path}: {value} is greater than {schema['maximum']}"
        lo, hi = {"int32": _INT32, "int64": _INT64}.get(schema.get("format", ""), (None, None))
        if lo is not None and hi is not None and not lo <= value <= hi:
            yield f"{path}: {value} overflows {schema['format']}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            yield f"{path}: fewer than {schema['minItems']} items"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield f"{path}: more than {schema['maxItems']} items"
        for i, item in enumerate(value):
            yield from schema_errors(item, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                yield from schema_errors(item, properties[key], f"{path}.{key}")
            elif isinstance(additional, dict):
                yield from schema_errors(item, additional, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields", False):
                yield f'{path}: unknown field "{key}"'
        for key in schema.get("required", []):
            if key not in value:
                yield f"{path}.{key}: required"


def with_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` after API-server defaulting: absent properties with a default are filled in."""
    if isinstance(value, dict):
        out = dict(value)
        for key, sub in schema.get("properties", {}).items():
            if key not in out and "default" in sub:
                out[key] = sub["default"]
            if key in out:
                out[key] = with_defaults(out[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            props = schema.get("properties", {})
            for key in out:
                if key not in props:
                    out[key] = with_defaults(out[key], additional)
        return out
    if isinstance(value, list) and "items" in schema:
        return [with_defaults(item, schema["items"]) for item in value]
    return value


def structural_problems(schema: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """Where a schema breaks the rules for CRD structural schemas (or Python cannot read it)."""
    if "type" not in schema and not (
        schema.get("x-kubernetes-int-or-string")
        or schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        yield f"{path or '<root>'}: no type"
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except re.error as exc:
            yield f"{path}: pattern does not compile: {exc}"
    if "default" in schema:
        for problem in schema_errors(schema["default"], schema, f"{path}(default)"):
            yield f"default is invalid: {problem}"
    for key, sub in schema.get("properties", {}).items():
        yield from structural_problems(sub, f"{path}.{key}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from structural_problems(schema["additionalProperties"], f"{path}.*")
    if "items" in schema:
        yield from structural_problems(schema["items"], f"{path}[]")
    if schema.get("type") == "array" and "items" not in schema:
        yield f"{path}: array without items"


def crd_version_schema(crd: Mapping[str, Any], version: str) -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(f"{crd['metadata']['name']} has no version {version}")


def custom_resource_errors(obj: Mapping[str, Any], crds: list[dict[str, Any]]) -> list[str]:
    """Validate a custom resource against the CRD (group, kind, version) it belongs to."""
    group, _, version = obj["apiVersion"].rpartition("/")
    matching = [
        c for c in crds if c["spec"]["group"] == group and c["spec"]["names"]["kind"] == obj["kind"]
    ]
    if not matching:
        return [f"no CRD for {obj['apiVersion']} {obj['kind']}"]
    crd = matching[0]
    served = {v["name"] for v in crd["spec"]["versions"] if v["served"]}
    if version not in served:
        return [f"{obj['kind']} version {version} is not served (served: {sorted(served)})"]
    # The API server checks metadata itself, whatever the CRD says about it.
    body = {k: v for k, v in obj.items() if k != "metadata"}
    errors = list(schema_errors(body, crd_version_schema(crd, version), obj["kind"]))
    errors += k8s_errors(obj.get("metadata", {}), "V1ObjectMeta", f"{obj['kind']}.metadata")
    namespaced = crd["spec"]["scope"] == "Namespaced"
    if not namespaced and obj.get("metadata", {}).get("namespace"):
        errors.append(f"{obj['kind']} is cluster-scoped but has a namespace")
    return errors


# --------------------------------------------------------------------------------------------
# Examples of the user documentation

EXAMPLES_FILE = Path(__file__).with_name("gateway_md_examples.yaml")
_YAML_BLOCK_RE = re.compile(r"```yaml\n(.*?)```", re.S)


def stunner_examples_in_markdown(text: str) -> list[dict[str, Any]]:
    """The ``stunner.l7mp.io`` objects of the YAML code blocks of a markdown document.

    Blocks are dedented, a stray heredoc terminator line (``EOF``) is dropped, and blocks that
    are not a single YAML object (shell sessions, fragments) are skipped.
    """
    found = []
    for block in _YAML_BLOCK_RE.findall(text):
        lines = [line for line in textwrap.dedent(block).splitlines() if line.strip() != "EOF"]
        try:
            doc = yaml.safe_load("\n".join(lines))
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith("stunner.l7mp.io/"):
            found.append(doc)
    return found


def seed_documents() -> list[Path]:
    """GATEWAY.md and GATEWAY-v1alpha1.md where the shared seed folder sits beside the checkout."""
    for root in (CHART_DIR.parents[2] / "shared",):
        seeds = root / "seeds"
        docs = [seeds / "GATEWAY.md", seeds / "GATEWAY-v1alpha1.md"]
        if all(d.is_file() for d in docs):
            return docs
    return []
