"""The Helm chart rendered with the real Helm engine (``helm_python``: libhelm_c, Helm 4's own
engine), offline: every template's objects and NOTES.txt, and the CRDs of ``crds/``.

Used by the chart's tests and by the test cluster's ``helm install`` (support.kube_stack).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "stunner"
RELEASE = "stunner"
NAMESPACE = "stunner-system"


# --------------------------------------------------------------------------------------------
# YAML


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys (the API server would keep only one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_documents(text: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document of ``text``, duplicate keys refused."""
    docs = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    for doc in docs:
        assert isinstance(doc, dict), f"a manifest document is not a mapping: {doc!r}"
    return docs


# --------------------------------------------------------------------------------------------
# Rendering


@dataclass(frozen=True, slots=True)
class Rendered:
    """The objects one render produced, by template, plus NOTES.txt."""

    by_template: Mapping[str, tuple[dict[str, Any], ...]]
    notes: str

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [obj for objs in self.by_template.values() for obj in objs]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
        return found[0]

    def kinds(self) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in self.objects}


def render(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> Rendered:
    """Render the chart with the real Helm engine, as ``helm install`` would."""
    with helm_python.Chart.load(CHART_DIR) as chart:
        out = chart.render(
            dict(values) if values is not None else None,
            name=release,
            namespace=namespace,
            is_install=True,
        )
    notes = ""
    by_template: dict[str, tuple[dict[str, Any], ...]] = {}
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            notes = text
        else:
            by_template[path] = tuple(load_documents(text))
    return Rendered(by_template, notes)


def chart_crds() -> list[dict[str, Any]]:
    """The CRDs Helm would install from ``crds/`` (read through the Helm engine)."""
    with helm_python.Chart.load(CHART_DIR) as chart:
        files = chart.crds
    return [doc for f in files for doc in load_documents(f["data"])]
