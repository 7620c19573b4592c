"""Compare two snapshots: canonical JSON, flattened to paths, each difference matched against the
documented ones (``documented.py``, explained in docs/upstream-differences.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from conformance.documented import DOCUMENTED, Documented

MISSING = "<absent>"


def canonical_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stunnerd config with order-free lists sorted (listeners, clusters, routes, endpoints)."""
    out: dict[str, Any] = json.loads(json.dumps(config))
    for section in ("listeners", "clusters"):
        items = out.get(section)
        if isinstance(items, list):
            for item in items:
                for key in ("routes", "endpoints"):
                    if isinstance(item.get(key), list):
                        item[key] = sorted(item[key])
            out[section] = sorted(items, key=lambda i: str(i.get("name", "")))
    return out


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b[name=x].c": leaf}``; list items with a ``name`` are keyed by it, others by index."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        if not value:
            out[prefix] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list):
        if not value:
            out[prefix] = []
        elif all(isinstance(i, Mapping) and "name" in i for i in value):
            for item in value:
                out.update(flatten(item, f"{prefix}[name={item['name']}]"))
        elif all(not isinstance(i, Mapping | list) for i in value):
            out[prefix] = value
        else:
            for index, item in enumerate(value):
                out.update(flatten(item, f"{prefix}[{index}]"))
    else:
        out[prefix] = value
    return out


@dataclass(frozen=True)
class Difference:
    path: str
    upstream: Any
    ours: Any
    documented: Documented | None

    def __str__(self) -> str:
        tag = f" [{self.documented.id}]" if self.documented else ""
        return f"{self.path}: upstream={_short(self.upstream)} ours={_short(self.ours)}{tag}"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if value is not MISSING else MISSING
    return text if len(text) <= 160 else text[:157] + "..."


def prepare(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    configs = {k: canonical_config(v) for k, v in (snapshot.get("configs") or {}).items()}
    return {**snapshot, "configs": configs}


def diff(upstream: Mapping[str, Any], ours: Mapping[str, Any]) -> list[Difference]:
    left, right = flatten(prepare(upstream)), flatten(prepare(ours))
    out = []
    for path in sorted(set(left) | set(right)):
        a, b = left.get(path, MISSING), right.get(path, MISSING)
        if a == b:
            continue
        out.append(Difference(path, a, b, match(path, a, b)))
    return out


def match(
    path: str, upstream: Any, ours: Any, table: Iterable[Documented] = DOCUMENTED
) -> Documented | None:
    for entry in table:
        if re.search(entry.path, path) and entry.accepts(upstream, ours):
            return entry
    return None
