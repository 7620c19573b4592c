"""Every deliberate difference from upstream's operator that ``make conformance`` may show.

Each entry names the flattened snapshot paths it covers (a regex), optionally the values it
accepts, and the section of docs/upstream-differences.md that gives the reason; a difference no
entry accepts makes ``make conformance`` fail. ``tests/conformance/test_documented.py`` pins that
each entry is explained in the document and accepts the difference it was written for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _any(_upstream: Any, _ours: Any) -> bool:
    return True


@dataclass(frozen=True)
class Documented:
    id: str
    path: str
    """A regex searched in the flattened path, e.g. ``^configs\\..*\\.admin\\.loglevel$``."""
    summary: str
    accepts: Callable[[Any, Any], bool] = _any


def _only_cds_token_added(upstream: Any, ours: Any) -> bool:
    return (
        isinstance(upstream, list)
        and isinstance(ours, list)
        and (sorted(ours) == sorted([*upstream, "CDS_TOKEN"]))
    )


def _programmed_added(upstream: Any, ours: Any) -> bool:
    return upstream == "<absent>" and isinstance(ours, list) and len(ours) == 2


def _no_endpoints_resolved(upstream: Any, ours: Any) -> bool:
    return bool(upstream == ["False", "BackendNotFound"] and ours == ["True", "ResolvedRefs"])


def _host_ports_added(upstream: Any, ours: Any) -> bool:
    if not (isinstance(upstream, list) and isinstance(ours, list)):
        return False
    extra = [p for p in ours if p not in upstream]
    return set(upstream) <= set(ours) and all(str(p).startswith(":") for p in extra)


_UPSTREAM_DATAPLANE_DEFAULTS: tuple[Any, ...] = ("<absent>", 3600, "20M", "250m")
_SEED_DATAPLANE_DEFAULTS: tuple[Any, ...] = ("<absent>", 30, {})


def _dataplane_defaults(upstream: Any, ours: Any) -> bool:
    return upstream in _UPSTREAM_DATAPLANE_DEFAULTS and ours in _SEED_DATAPLANE_DEFAULTS


_UPSTREAM_DEFAULT_ARGS = ["-w", "--udp-thread-num=16"]


def _default_args_one_process(upstream: Any, ours: Any) -> bool:
    return bool(upstream == _UPSTREAM_DEFAULT_ARGS and ours == ["-w"])


def _pull_policy_by_tag(upstream: Any, ours: Any) -> bool:
    return bool(upstream == "Always" and ours == "IfNotPresent")


def _empty_cluster_kept(upstream: Any, ours: Any) -> bool:
    return upstream == "<absent>" and isinstance(ours, str)


DOCUMENTED: tuple[Documented, ...] = (
    Documented(
        "missing-staticservice-empty-cluster",
        r"^configs\.[^.]+\.clusters\[name=[^\]]+\]\.(name|type|protocol)$",
        "a route whose only backend is a missing StaticService keeps an empty cluster (ours); "
        "upstream drops the cluster and leaves the listener's route dangling",
        _empty_cluster_kept,
    ),
    Documented(
        "dataplane-defaults",
        r"^deployments\.[^.]+\.(terminationGracePeriodSeconds|containers\[name=[^\]]+\]"
        r"\.resources(\..+)?)$",
        "a Dataplane without resources or terminationGracePeriodSeconds: GATEWAY.md's defaults "
        "(none, 30 s), not upstream's code (cpu 250m, memory 20M, 3600 s)",
        _dataplane_defaults,
    ),
    Documented(
        "dataplane-default-args",
        r"^deployments\.[^.]+\.containers\[name=[^\]]+\]\.args$",
        "a Dataplane without args: stunnerd -w in one process, not upstream's 16 UDP threads",
        _default_args_one_process,
    ),
    Documented(
        "dataplane-default-pull-policy",
        r"^deployments\.[^.]+\.containers\[name=[^\]]+\]\.imagePullPolicy$",
        "a Dataplane without imagePullPolicy: GATEWAY.md's IfNotPresent for a tagged image, not "
        "upstream's Always",
        _pull_policy_by_tag,
    ),
    Documented(
        "hostnetwork-listener-ports",
        r"^deployments\.[^.]+\.containers\[name=[^\]]+\]\.ports$",
        "with hostNetwork our stunnerd container declares each listener port as a host port",
        _host_ports_added,
    ),
    Documented(
        "dataplane-env-cds-token",
        r"^deployments\.[^.]+\.containers\[name=[^\]]+\]\.env$",
        "our stunnerd pods get CDS_TOKEN (the CDS bearer token) besides upstream's variables",
        _only_cds_token_added,
    ),
    Documented(
        "listener-programmed",
        r"^statuses\.Gateway [^.]+\.listeners\..+\.conditions\.Programmed$",
        "every listener status of ours carries the Programmed condition Gateway API v1 requires",
        _programmed_added,
    ),
    Documented(
        "route-resolvedrefs-no-endpoints",
        r"UDPRoute .+\.parents\..+\.ResolvedRefs$",
        "a backend Service that exists but has no endpoints is resolved (ours), not "
        "BackendNotFound (upstream)",
        _no_endpoints_resolved,
    ),
)
