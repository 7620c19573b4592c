"""Helpers of the operator unit tests: build objects from YAML, snapshot a render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from stunner_common.crds import K8sObject, parse_object
from stunner_operator.render.engine import Renderer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "operator"


def objects_from_yaml(text: str) -> list[K8sObject]:
    return [parse_object(doc) for doc in yaml.safe_load_all(text) if doc]


def snapshot(renderer: Renderer) -> dict[str, Any]:
    """Everything a render produced, as plain JSON-able data keyed by readable names."""
    statuses = {}
    for key, status in sorted(renderer.statuses().items()):
        label = f"{key[0]} {key[1]}/{key[2]}" if key[1] else f"{key[0]} {key[2]}"
        statuses[label] = status.to_k8s()
    services = {}
    deployments = {}
    for render in renderer.gateway_renders():
        if render.service is not None:
            services[render.config_id] = render.service
        if render.deployment is not None:
            deployments[render.config_id] = render.deployment
    return {
        "configs": {
            cid: json.loads(cfg.canonical_json()) for cid, cfg in sorted(renderer.configs().items())
        },
        "statuses": statuses,
        "services": services,
        "deployments": deployments,
    }
