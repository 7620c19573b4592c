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


def _route_not_accepted_unserved(upstream: Any, ours: Any) -> bool:
    return bool(upstream == ["True", "Accepted"] and ours == ["False", "Pending"])


def _orphan_cluster_dropped(upstream: Any, ours: Any) -> bool:
    """Upstream's orphan cluster, leaf by leaf: its name, type and protocol, and endpoints that
    are a Service's ClusterIP (named ``<clusterIP ns/name>`` by the comparison)."""
    if ours != "<absent>":
        return False
    if isinstance(upstream, list):
        return bool(upstream) and all(str(e).startswith("<clusterIP ") for e in upstream)
    return isinstance(upstream, str)


def _static_prefixes_kept(upstream: Any, ours: Any) -> bool:
    """Upstream drops a StaticService's prefixes after a missing backend; ClusterIPs (named
    ``<clusterIP ns/name>`` by the comparison) are not what that bug drops."""
    return (
        upstream == "<absent>"
        and isinstance(ours, list)
        and bool(ours)
        and all(isinstance(e, str) and not e.startswith("<") for e in ours)
    )


def _user_quota_rendered(upstream: Any, ours: Any) -> bool:
    return upstream == "<absent>" and isinstance(ours, int) and not isinstance(ours, bool)


def _auth_lifetime_rendered(upstream: Any, ours: Any) -> bool:
    return upstream == "<absent>" and isinstance(ours, str) and ours.isdigit()


def _node_address_placeholder(upstream: Any, ours: Any) -> bool:
    return bool(upstream == "$STUNNER_ADDR" and ours == "__node_address_placeholder")


def _stun_mode_auth_none(upstream: Any, ours: Any) -> bool:
    if upstream in ("static", "ephemeral") and ours == "none":
        return True  # auth.type
    if upstream == "<absent>" and ours == {}:
        return True  # auth.credentials: no credentials at all
    return isinstance(upstream, str) and ours == "<absent>"  # each credential left out


def _daemonset_rendered(upstream: Any, ours: Any) -> bool:
    return bool((upstream, ours) == ("Deployment", "DaemonSet")) or (
        isinstance(upstream, int) and ours is None
    )


def _left_out_as_conflicted(upstream: Any, ours: Any) -> bool:
    """A listener's leaves in the config, or its port's leaves in the Service: upstream has
    them, ours has none."""
    return upstream != "<absent>" and not isinstance(upstream, dict) and ours == "<absent>"


def _listener_status_conflicted(upstream: Any, ours: Any) -> bool:
    return (upstream, ours) in (
        (["True", "Accepted"], ["False", "PortUnavailable"]),
        (["False", "NoConflicts"], ["True", "PortConflict"]),
    )


def _targetport_conflicted(upstream: Any, ours: Any) -> bool:
    return _left_out_as_conflicted(upstream, ours) or _listener_status_conflicted(upstream, ours)


def _port_conflict_reason(upstream: Any, ours: Any) -> bool:
    return bool(upstream == ["True", "ProtocolConflict"] and ours == ["True", "PortConflict"])


def _listeners_not_valid(upstream: Any, ours: Any) -> bool:
    return upstream == ["True", "Accepted"] and ours in (
        ["True", "ListenersNotValid"],
        ["False", "ListenersNotValid"],
    )


def _service_without_a_refused_port(upstream: Any, ours: Any) -> bool:
    if upstream == {} and ours == "<absent>":
        return True  # ``services``: upstream has none at all in the case, ours has some
    return bool(upstream == "<absent>" and ours not in ("<absent>", {}))


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
    Documented(
        "route-accepted-unserved-parent",
        r"UDPRoute .+\.parents\..+\.Accepted$",
        "a route whose parent Gateway renders no config, or that attaches only to listeners left "
        "out of it, is Accepted False/Pending (ours), not True/Accepted (upstream)",
        _route_not_accepted_unserved,
    ),
    Documented(
        "route-unserved-no-cluster",
        r"^configs\.[^.]+\.clusters\[name=[^\]]+\]\.(name|type|protocol|endpoints)$",
        "a route that no listener of the config names gets no cluster (ours); upstream renders "
        "an orphan cluster for it",
        _orphan_cluster_dropped,
    ),
    Documented(
        "route-missing-first-backend",
        r"^configs\.[^.]+\.clusters\[name=[^\]]+\]\.endpoints$",
        "a StaticService after a missing backend keeps its prefixes (ours); upstream drops them",
        _static_prefixes_kept,
    ),
    Documented(
        "premium-user-quota",
        r"^configs\.[^.]+\.admin\.user_quota$",
        "userQuota reaches stunnerd's admin.user_quota (ours); upstream's open build drops it",
        _user_quota_rendered,
    ),
    Documented(
        "premium-auth-lifetime",
        r"^configs\.[^.]+\.auth\.credentials\.lifetime$",
        "authLifetime reaches the ephemeral credentials (ours); upstream's open build drops it",
        _auth_lifetime_rendered,
    ),
    Documented(
        "premium-relay-address-discovery",
        r"^configs\.[^.]+\.listeners\[name=[^\]]+\]\.address$",
        "enable-relay-address-discovery puts the node-address placeholder in each listener "
        "(ours); upstream's open build keeps $STUNNER_ADDR",
        _node_address_placeholder,
    ),
    Documented(
        "premium-stun-mode",
        r"^configs\.[^.]+\.auth\.(type|credentials(\.(username|password|secret))?)$",
        "stunMode: true renders auth none without credentials (ours); upstream's open build "
        "keeps the configured auth",
        _stun_mode_auth_none,
    ),
    Documented(
        "premium-daemonset",
        r"^deployments\.[^.]+\.(kind|replicas)$",
        "dataplaneResource: DaemonSet renders a DaemonSet (ours); upstream's open build renders "
        "a Deployment",
        _daemonset_rendered,
    ),
    Documented(
        "targetport-conflict",
        r"^(configs\.[^.]+\.listeners\[name=[^\]]+\]\.(name|address|port|protocol|routes)"
        r"|services\.[^.]+\.ports\[name=[^\]]+\]\.(name|nodePort|port|protocol|targetPort)"
        r"|statuses\.Gateway [^.]+\.listeners\..+\.conditions\.(Accepted|Conflicted))$",
        "a listener the targetport annotation maps onto another listener's port is conflicted "
        "and left out of the config and the Service (ours); upstream keeps both",
        _targetport_conflicted,
    ),
    Documented(
        "listener-port-conflict-reason",
        r"^statuses\.Gateway [^.]+\.listeners\..+\.conditions\.Conflicted$",
        "two listeners of one protocol on one port: Conflicted PortConflict (ours), "
        "ProtocolConflict (upstream)",
        _port_conflict_reason,
    ),
    Documented(
        "gateway-listeners-not-valid",
        r"^statuses\.Gateway [^.]+\.conditions\.Accepted$",
        "a Gateway with a rejected listener is Accepted with reason ListenersNotValid (ours), "
        "plain Accepted (upstream)",
        _listeners_not_valid,
    ),
    Documented(
        "same-port-listeners-service",
        r"^services(\.[^.]+\..+)?$",
        "two listeners on one port of one transport: upstream's Service repeats the port and the "
        "API server refuses it, so there is none; ours leaves the later listener out and has one",
        _service_without_a_refused_port,
    ),
)
