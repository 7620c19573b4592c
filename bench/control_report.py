"""The pure parts of `bench control`: the combos it applies, when a side has converged, the
operator's writes counted from the API server's audit log, percentiles and the report lines.

Kept apart from bench/bench_control.py (which starts clusters and processes) so that the unit tests
(tests/unit/test_bench_control.py) run them on known inputs.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CLASS_NAME = "bench-gwclass"
CONFIG_NAME = "bench-gwconfig"
CONTROL_NS = "stunner"
NS_PREFIX = "bench-ns-"
GATEWAY_PREFIX = "bench-gw-"
ROUTE_PREFIX = "bench-udproute-"
SERVICE_PREFIX = "bench-svc-"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def parse_counts(raw: str) -> list[int]:
    """``"100,300"`` -> ``[100, 300]`` (blanks and empty items ignored, each at least 1)."""
    out = []
    for item in raw.replace(" ", "").split(","):
        if item:
            value = int(item)
            if value < 1:
                raise ValueError(f"a count must be at least 1: {item!r}")
            out.append(value)
    return out


def class_objects(controller: str) -> list[dict[str, Any]]:
    """The one GatewayClass and GatewayConfig every combo's Gateway uses (upstream's shape)."""
    return [
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": {"name": CONFIG_NAME, "namespace": CONTROL_NS},
            "spec": {
                "realm": "stunner.l7mp.io",
                "authType": "static",
                "userName": "user-1",
                "password": "pass-1",
            },
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": CLASS_NAME},
            "spec": {
                "controllerName": controller,
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": CONFIG_NAME,
                    "namespace": CONTROL_NS,
                },
            },
        },
    ]


def combo(index: int) -> list[dict[str, Any]]:
    """Combo ``index``: its Namespace, a Service (no selector), a Gateway and a UDPRoute."""
    ns = f"{NS_PREFIX}{index}"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{SERVICE_PREFIX}{index}", "namespace": ns},
            "spec": {"ports": [{"name": "media", "port": 9001, "protocol": "UDP"}]},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": f"{GATEWAY_PREFIX}{index}", "namespace": ns},
            "spec": {
                "gatewayClassName": CLASS_NAME,
                "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
            },
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "UDPRoute",
            "metadata": {"name": f"{ROUTE_PREFIX}{index}", "namespace": ns},
            "spec": {
                "parentRefs": [{"name": f"{GATEWAY_PREFIX}{index}"}],
                "rules": [{"backendRefs": [{"name": f"{SERVICE_PREFIX}{index}"}]}],
            },
        },
    ]


def config_id(index: int) -> str:
    return f"{NS_PREFIX}{index}/{GATEWAY_PREFIX}{index}"


def cluster_name(index: int) -> str:
    return f"{NS_PREFIX}{index}/{ROUTE_PREFIX}{index}"


def served_with_route(configs: Mapping[str, Any], index: int) -> bool:
    """Whether the CDS serves combo ``index``'s config with its route's cluster."""
    cfg = configs.get(config_id(index))
    if not isinstance(cfg, dict):
        return False
    return any(c.get("name") == cluster_name(index) for c in cfg.get("clusters") or [])


def accepted_gateways(gateways: Iterable[Mapping[str, Any]]) -> set[int]:
    """The indices of the bench's Gateways whose status says Accepted=True."""
    out = set()
    for gw in gateways:
        meta = gw.get("metadata") or {}
        ns = str(meta.get("namespace", ""))
        if not ns.startswith(NS_PREFIX) or not str(meta.get("name", "")).startswith(GATEWAY_PREFIX):
            continue
        for cond in (gw.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Accepted" and cond.get("status") == "True":
                with contextlib.suppress(ValueError):
                    out.add(int(ns.removeprefix(NS_PREFIX)))
    return out


def converged(configs: Mapping[str, Any], accepted: set[int], indices: Iterable[int]) -> list[int]:
    """The combos of ``indices`` not converged yet (served with their route, and Accepted)."""
    return [i for i in indices if i not in accepted or not served_with_route(configs, i)]


@dataclass
class Writes:
    """An operator's writes in the audit log: total, and by (verb, resource[/subresource])."""

    total: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    leases: int = 0
    """Lease writes (leader election renewals), left out of ``total``: they count time, not
    combos."""


def operator_writes(
    lines: Iterable[str], is_operator: Any, since: float = 0.0, until: float = float("inf")
) -> Writes:
    """Count the audit events (JSON lines) of writes that ``is_operator(event)`` says are the
    operator's, stamped in [since, until] (seconds since the epoch, from ``stageTimestamp``)."""
    from datetime import datetime

    writes = Writes()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("verb") not in WRITE_VERBS or not is_operator(event):
            continue
        stamp = event.get("stageTimestamp") or event.get("requestReceivedTimestamp")
        if stamp:
            at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            if not since <= at <= until:
                continue
        ref = event.get("objectRef") or {}
        what = ref.get("resource", "?") + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        if ref.get("resource") == "leases":
            writes.leases += 1
            continue
        writes.total += 1
        writes.by_kind[f"{event['verb']} {what}"] += 1
    return writes


def user_agent_is(prefixes: tuple[str, ...], username: str | None = None) -> Any:
    """A predicate on audit events: the request came from ``username`` (when given) with a user
    agent starting with one of ``prefixes`` (empty: any)."""

    def check(event: Mapping[str, Any]) -> bool:
        user = (event.get("user") or {}).get("username", "")
        if username is not None and user != username:
            return False
        agent = str(event.get("userAgent", ""))
        return not prefixes or agent.startswith(prefixes)

    return check


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-int(q * len(ordered) * 1000) // 1000))
    return ordered[min(len(ordered), rank) - 1]


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Prometheus samples by name and sorted labels."""


def metric_samples(text: str) -> Samples:
    """The samples of a Prometheus text exposition (``/metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample_delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much a counter grew between two scrapes."""
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def bucket_quantile(before: Samples, after: Samples, histogram: str, q: float) -> float:
    """The upper bound of the bucket that holds the ``q`` quantile of what ``histogram``
    observed between two scrapes (the quantile is at most this); inf past the last bound, NaN
    for no observation."""
    bucket = f"{histogram}_bucket"
    bounds = sorted(
        (float(dict(labels)["le"]), value - before.get((name, labels), 0.0))
        for (name, labels), value in after.items()
        if name == bucket
    )
    total = bounds[-1][1] if bounds else 0.0
    if total <= 0:
        return float("nan")
    for bound, count in bounds:
        if count >= q * total:
            return bound
    return float("inf")


MARKER_BASE = (10 << 24) | (128 << 16)  # 10.128.0.0: update n writes address MARKER_BASE + n
MARKER = re.compile(rb"10\.(1[2-9]\d|2[0-4]\d)\.(\d{1,3})\.(\d{1,3})")


def marker_address(seq: int) -> str:
    value = MARKER_BASE + seq
    return ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))


def newest_marker(frame: bytes) -> int:
    """The highest update number whose address ``frame`` carries; -1 for none."""
    best = -1
    for a, b, c in MARKER.findall(frame):
        seq = ((10 << 24) | (int(a) << 16) | (int(b) << 8) | int(c)) - MARKER_BASE
        if seq > best:
            best = seq
    return best


@dataclass
class SideResult:
    side: str
    n: int
    converge_s: float
    pending: int
    cpu_s: float
    peak_rss_mib: float
    one_more_s: float
    writes: Writes
    writes_source: str
    note: str = ""
    combos_written: int = 0
    """How many combos the counted writes are for (N, or N + 1 with the one more); 0: N."""

    @property
    def writes_per_combo(self) -> float:
        combos = self.combos_written or self.n
        return self.writes.total / combos if combos else float("nan")


def report_lines(results: Iterable[SideResult]) -> list[str]:
    rows = list(results)
    lines = [
        f"{'side':<9} {'N':>5} {'converge s':>10} {'left':>5} {'CPU s':>7} {'peak MiB':>8} "
        f"{'+1 combo s':>10} {'writes/combo':>12}"
    ]
    for r in rows:
        lines.append(
            f"{r.side:<9} {r.n:>5} {r.converge_s:>10.1f} {r.pending:>5} {r.cpu_s:>7.1f} "
            f"{r.peak_rss_mib:>8.0f} {r.one_more_s:>10.2f} {r.writes_per_combo:>12.1f}"
        )
        top = ", ".join(f"{k} {v}" for k, v in r.writes.by_kind.most_common(5))
        lines.append(
            f"{'':<9} writes ({r.writes_source}; Lease renewals apart: {r.writes.leases}): "
            f"{top or 'none'}"
        )
        if r.note:
            lines.append(f"{'':<9} {r.note}")
    by_n: dict[int, dict[str, SideResult]] = {}
    for r in rows:
        by_n.setdefault(r.n, {})[r.side] = r
    for n, sides in sorted(by_n.items()):
        ours, theirs = sides.get("ours"), sides.get("upstream")
        if ours is None or theirs is None:
            continue
        for label, mine, peer in (
            ("converge_s", ours.converge_s, theirs.converge_s),
            ("operator_cpu_s", ours.cpu_s, theirs.cpu_s),
            ("peak_rss", ours.peak_rss_mib, theirs.peak_rss_mib),
            ("one_more_combo_s", ours.one_more_s, theirs.one_more_s),
            ("writes_per_combo", ours.writes_per_combo, theirs.writes_per_combo),
        ):
            if theirs.pending and label in ("converge_s", "operator_cpu_s"):
                lines.append(
                    f"RATIO control N={n} {label} ours/upstream: upstream left "
                    f"{theirs.pending} of {n} unconverged; no ratio"
                )
                continue
            ratio = f"{mine / peer:.2f}" if peer > 0 else "n/a"
            lines.append(f"RATIO control N={n} {label} ours/upstream = {ratio}")
    return lines
