"""``--dry-run``: render a manifest folder once and show every object the operator would write.

The output is a YAML stream, in this order: the GatewayClasses, Gateways and UDPRoutes (both API
versions) the operator manages, as read plus the ``status`` it computes; then per Gateway a
``v1`` ConfigMap named like the Gateway whose ``data["stunnerd.conf"]`` is the rendered stunnerd
config (the JSON that goes to Redis, in upstream's legacy ConfigMap shape), its LoadBalancer
Service and its dataplane Deployment, exactly as they would be applied. Conditions carry no
``lastTransitionTime``: that is set when a status is written.

Problems with the input are returned as one line each, starting with the file and document
index of the object concerned: files that do not parse, objects that are invalid or skipped,
malformed annotations, every condition that says the input is wrong (``Accepted`` or
``ResolvedRefs`` not True), and every route whose parent Gateways do not exist.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stunner_common.crds import Gateway
from stunner_operator.manifests.loader import ManifestSet
from stunner_operator.manifests.local import missing_parent_warning
from stunner_operator.render.annotations import (
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
    owner_reference,
)
from stunner_operator.render.engine import Renderer
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.status import Condition, GatewayStatus, RouteStatus, Status
from stunner_operator.render.store import ObjKey, View

CONFIG_KEY = "stunnerd.conf"
_KIND_ORDER = {"GatewayClass": 0, "Gateway": 1, "UDPRoute": 2, "UDPRouteV1A2": 3}
_INPUT_CONDITIONS = ("Accepted", "ResolvedRefs")


@dataclass(frozen=True, slots=True)
class DryRun:
    documents: list[dict[str, Any]]
    problems: list[str]

    def yaml(self) -> str:
        return yaml.safe_dump_all(
            self.documents, sort_keys=False, explicit_start=True, width=1 << 30
        )


def _label(key: ObjKey) -> str:
    kind = "UDPRoute (gateway.networking.k8s.io/v1alpha2)" if key[0] == "UDPRouteV1A2" else key[0]
    return f"{kind} {key[1]}/{key[2]}" if key[1] else f"{kind} {key[2]}"


def _bad_conditions(status: Status) -> list[str]:
    """``Type=Status (Reason): message`` for every condition that says the input is wrong."""

    def fmt(c: Condition, prefix: str = "") -> str:
        return f"{prefix}{c.type}={c.status} ({c.reason}): {c.message}"

    if isinstance(status, RouteStatus):
        out: list[str] = []
        for parent in status.parents:
            where = f"parent {parent.parent_ref.label(status.namespace)}: "
            out.extend(fmt(c, where) for c in parent.conditions if _is_bad(c))
        return out
    out = [fmt(c) for c in status.conditions if _is_bad(c)]
    if isinstance(status, GatewayStatus):
        for ls in status.listeners:
            out.extend(fmt(c, f"listener {ls.name}: ") for c in ls.conditions if _is_bad(c))
    return out


def _is_bad(c: Condition) -> bool:
    return c.type in _INPUT_CONDITIONS and c.status != "True"


def _config_map(
    namespace: str, name: str, config_json: str, owner: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                OWNED_BY_LABEL: OWNED_BY_VALUE,
                RELATED_GATEWAY_NAME: name,
                RELATED_GATEWAY_NAMESPACE: namespace,
            },
            "annotations": {RELATED_GATEWAY_NAME: f"{namespace}/{name}"},
            "ownerReferences": [owner],
        },
        "data": {CONFIG_KEY: config_json},
    }


def dry_run(root: Path, options: RenderOptions | None = None) -> DryRun:
    """Read ``root`` once, render everything, and collect what would be written."""
    manifests = ManifestSet(root)
    loaded = manifests.reload()
    problems = [str(err) for err in loaded.new_errors]
    problems.extend(loaded.skipped)
    renderer = Renderer(options)
    renderer.apply(loaded.objects.values())

    def where(key: ObjKey) -> str:
        origin = manifests.origin.get(key)
        return f"{origin[0]} document {origin[1]}: " if origin else ""

    def by_origin(key: ObjKey) -> tuple[str, int, str, str, str]:
        path, index = manifests.origin.get(key, ("", 0))
        return (path, index, *key)

    found: list[tuple[tuple[str, int, str, str, str], str]] = []

    documents: list[dict[str, Any]] = []
    statuses = renderer.statuses()
    for key in sorted(statuses, key=lambda k: (_KIND_ORDER.get(k[0], 9), k[1], k[2])):
        status = statuses[key]
        obj = loaded.objects[key]
        doc = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
        doc.pop("status", None)
        doc["status"] = status.to_k8s()
        documents.append(doc)
        found.extend(
            (by_origin(key), f"{where(key)}{_label(key)}: {line}")
            for line in _bad_conditions(status)
        )
    view = View(renderer.store)
    for key, obj in loaded.objects.items():
        # A route whose parents all do not exist gets no status: its problem is said here.
        if key not in statuses and (warning := missing_parent_warning(view, obj)) is not None:
            found.append((by_origin(key), f"{where(key)}{_label(key)}: {warning}"))
    configs = renderer.configs()
    for render in renderer.gateway_renders():
        found.extend(
            (by_origin(render.key), f"{where(render.key)}{_label(render.key)}: {w}")
            for w in render.warnings
        )
        gw = loaded.objects[render.key]
        assert isinstance(gw, Gateway)
        cid = render.config_id
        if cid in configs:
            owner = owner_reference(gw)
            documents.append(
                _config_map(render.key[1], render.key[2], configs[cid].canonical_json(), owner)
            )
        if render.service is not None:
            documents.append(json.loads(json.dumps(render.service)))
        if render.deployment is not None:
            documents.append(json.loads(json.dumps(render.deployment)))
    found.sort(key=lambda item: item[0])  # stable: a Gateway's lines keep their order
    problems.extend(line for _, line in found)
    return DryRun(documents, problems)
