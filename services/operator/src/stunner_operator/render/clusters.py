"""UDPRoute backends → one stunnerd cluster per route (UDPRoute in https://github.com/l7mp/stunner/blob/main/docs/GATEWAY.md).

A cluster admits peers: the addresses of a route's backend Services (EndpointSlice addresses plus
the ClusterIP) or the prefixes of its StaticServices, each optionally narrowed to a port range.
Every backend that cannot be resolved is reported with what to fix, and the cluster keeps
whatever did resolve; endpoints are validated, deduplicated and sorted so the output is stable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from stunner_common.config import ClusterConfig, ClusterType, ConfigError, parse_endpoint
from stunner_common.crds import (
    GATEWAY_GROUP,
    STUNNER_GROUP,
    BackendRef,
    Service,
    StaticService,
    UDPRoute,
)
from stunner_operator.render.grants import Reference, not_permitted_message, reference_permitted
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.store import Route, View

MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class BackendProblem:
    reason: str  # "InvalidKind" | "BackendNotFound" | "RefNotPermitted"
    message: str


@dataclass(frozen=True, slots=True)
class ClusterRender:
    cluster: ClusterConfig | None
    problems: tuple[BackendProblem, ...]


def route_id(route: Route) -> str:
    return f"{route.metadata.namespace}/{route.metadata.name}"


def _port_range(ref: BackendRef, route: Route) -> tuple[int, int]:
    # Gateway API v1alpha2 routes require a port but STUNner ignores it there.
    if not isinstance(route, UDPRoute) or ref.port is None:
        return (1, MAX_PORT)
    lo = ref.port
    hi = ref.end_port if ref.end_port is not None and ref.end_port >= lo else lo
    return (lo, hi)


def _with_range(addr: str, lo: int, hi: int) -> str:
    if (lo, hi) == (1, MAX_PORT):
        return addr
    return f"{addr}:<{lo}-{hi}>"


def _service_endpoints(
    view: View, ns: str, name: str, options: RenderOptions
) -> tuple[list[str], list[BackendProblem]]:
    problems: list[BackendProblem] = []
    addrs: list[str] = []
    for eps in view.slices_of(ns, name):
        for ep in eps.endpoints:
            # Not-ready and terminating endpoints stay admitted so that calls drain gracefully.
            addrs.extend(ep.addresses)
    svc = view.get(Service, ns, name)
    if svc is None:
        problems.append(BackendProblem("BackendNotFound", f"Service {ns}/{name} not found"))
    elif options.relay_to_cluster_ip:
        # a dual-stack Service has a cluster IP per family (clusterIPs, primary first)
        cips = [
            ip for ip in svc.spec.cluster_ips or (svc.spec.cluster_ip,) if ip not in ("", "None")
        ]
        if not cips:
            problems.append(
                BackendProblem(
                    "BackendNotFound", f"Service {ns}/{name} has no cluster IP (headless)"
                )
            )
        else:
            addrs.extend(cips)
    if svc is not None and not addrs:
        problems.append(BackendProblem("BackendNotFound", f"Service {ns}/{name} has no endpoints"))
    return addrs, problems


def render_cluster(view: View, route: Route, options: RenderOptions) -> ClusterRender:
    """The cluster for ``route`` and the problems found with its backends."""
    problems: list[BackendProblem] = []
    endpoints: dict[str, tuple[str, str]] = {}  # endpoint text -> (origin, address) for errors
    ctype: str | None = None
    for rule in route.spec.rules:
        for ref in rule.backend_refs:
            backend = _backend(view, route, ref, options, problems)
            if backend is None:
                continue
            btype, addrs, origin = backend
            if ctype is not None and btype != ctype:
                problems.append(
                    BackendProblem(
                        "BackendNotFound",
                        f"{origin}: cannot mix {btype} and {ctype} backends in one route",
                    )
                )
                continue
            ctype = btype
            lo, hi = _port_range(ref, route)
            for addr in addrs:
                text = _with_range(addr, lo, hi) if btype == "STATIC" else addr
                endpoints.setdefault(text, (origin, addr))
    cluster = _checked_cluster(route, ctype or "STATIC", endpoints, problems)
    return ClusterRender(cluster, tuple(problems))


def _backend(
    view: View,
    route: Route,
    ref: BackendRef,
    options: RenderOptions,
    problems: list[BackendProblem],
) -> tuple[str, list[str], str] | None:
    """One backendRef as (cluster type, addresses, origin for messages); None, with the
    problem added, when it cannot be used."""
    group = ref.group or ""
    kind = ref.kind or "Service"
    ns = ref.namespace or route.metadata.namespace
    problem: BackendProblem | None = None
    if group not in ("", STUNNER_GROUP):
        problem = BackendProblem("InvalidKind", f"backend {ref.name}: unsupported group {group!r}")
    elif kind not in ("Service", "StaticService"):
        problem = BackendProblem("InvalidKind", f"backend {ref.name}: unsupported kind {kind!r}")
    elif kind == "StaticService" and group != STUNNER_GROUP:
        problem = BackendProblem(
            "InvalidKind", f"backend {ref.name}: StaticService needs group {STUNNER_GROUP}"
        )
    if problem is None and ns != route.metadata.namespace:
        target = Reference(
            from_group=STUNNER_GROUP if isinstance(route, UDPRoute) else GATEWAY_GROUP,
            from_kind="UDPRoute",
            from_ns=route.metadata.namespace,
            to_group=group,
            to_kind=kind,
            to_ns=ns,
            to_name=ref.name,
        )
        if not reference_permitted(view, target, options):
            problem = BackendProblem("RefNotPermitted", not_permitted_message(target))
    if problem is not None:
        problems.append(problem)
        return None
    if kind == "StaticService":
        ssvc = view.get(StaticService, ns, ref.name)
        if ssvc is None:
            problems.append(
                BackendProblem("BackendNotFound", f"StaticService {ns}/{ref.name} not found")
            )
            return None
        return "STATIC", list(ssvc.spec.prefixes), f"StaticService {ns}/{ref.name}"
    origin = f"Service {ns}/{ref.name}"
    if options.endpoint_discovery:
        addrs, found = _service_endpoints(view, ns, ref.name, options)
        problems.extend(found)
        return "STATIC", addrs, origin
    if view.get(Service, ns, ref.name) is None:
        problems.append(BackendProblem("BackendNotFound", f"Service {ns}/{ref.name} not found"))
    return "STRICT_DNS", [f"{ref.name}.{ns}.svc.cluster.local"], origin


def _checked_cluster(
    route: Route,
    ctype: str,
    endpoints: dict[str, tuple[str, str]],
    problems: list[BackendProblem],
) -> ClusterConfig | None:
    """The cluster, leaving out (with a problem each) the endpoints that do not parse."""
    try:
        return _cluster(route, ctype, endpoints)
    except (ConfigError, ValueError):
        pass
    # Find the culprits one by one (the common, valid case validates each endpoint once).
    for text, (origin, addr) in list(endpoints.items()):
        try:
            parse_endpoint(text)
        except ConfigError:
            problems.append(
                BackendProblem("BackendNotFound", f"{origin}: invalid address {addr!r}")
            )
            del endpoints[text]
    try:
        return _cluster(route, ctype, endpoints)
    except (ConfigError, ValueError) as err:
        problems.append(BackendProblem("BackendNotFound", f"invalid cluster: {err}"))
        return None


def _cluster(route: Route, ctype: str, endpoints: dict[str, tuple[str, str]]) -> ClusterConfig:
    return ClusterConfig(
        name=route_id(route),
        type=cast(ClusterType, ctype),
        protocol="UDP",
        endpoints=tuple(sorted(endpoints)),
    )
