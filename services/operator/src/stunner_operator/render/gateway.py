"""One Gateway → one stunnerd config, its status, and its desired Service and Deployment.

This follows upstream's GATEWAY.md (https://github.com/l7mp/stunner/blob/main/docs/GATEWAY.md):
the GatewayClass → GatewayConfig → Dataplane hierarchy must resolve, auth must render, then each
listener is checked (protocol, port conflicts, TLS), given a public address, and given the routes
attached to it; the routes' clusters complete the config.
A broken hierarchy or auth invalidates the Gateway: it gets a status that says why, no config
(so the dataplane's config is deleted), and its Service and Deployment are marked for deletion.
The hierarchy lives in ``hierarchy.py`` and the per-listener pieces in ``listeners.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from stunner_common.config import (
    AdminConfig,
    ClusterConfig,
    ConfigError,
    ListenerConfig,
    OffloadEngine,
    StunnerConfig,
)
from stunner_common.contracts.listener_address import NODE_ADDRESS_PLACEHOLDER
from stunner_common.contracts.listener_port import TARGETPORT_ANNOTATION, TargetPorts
from stunner_common.crds import Dataplane, Gateway, GatewayConfig
from stunner_operator.render.annotations import (
    DISABLE_MANAGED_DATAPLANE,
    MIXED_PROTOCOL,
    RELAY_ADDRESS_DISCOVERY,
    annotation_problems,
    is_true,
    merged_annotations,
)
from stunner_operator.render.auth import AuthError, render_auth
from stunner_operator.render.clusters import ClusterRender, route_id
from stunner_operator.render.dataplane import dataplane_problems, render_deployment, workload_kind
from stunner_operator.render.families import address_family, hinted_ips
from stunner_operator.render.hierarchy import Hierarchy, class_status, resolve_hierarchy
from stunner_operator.render.listeners import (
    _listener_config,
    _listener_status,
    _ListenerState,
    _public_address,
    _public_service,
    _tls_material,
)
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.routes import is_masked, parent_names, ref_attaches
from stunner_operator.render.service import ExposedListener, exposed_listeners, render_service
from stunner_operator.render.status import (
    Condition,
    GatewayStatus,
    ListenerStatus,
    false,
    true,
    unknown,
)
from stunner_operator.render.store import ObjKey, Route, View, key_of

__all__ = [
    "DEFAULT_HEALTHCHECK",
    "METRICS_ENDPOINT",
    "PROTOCOLS",
    "TLS_PROTOCOLS",
    "UDP_FAMILY",
    "ClusterFn",
    "GatewayRender",
    "Hierarchy",
    "class_status",
    "render_gateway",
    "resolve_hierarchy",
]

PROTOCOLS = {
    "TURN-UDP": "TURN-UDP",
    "TURN-TCP": "TURN-TCP",
    "TURN-TLS": "TURN-TLS",
    "TURN-DTLS": "TURN-DTLS",
    "UDP": "TURN-UDP",
    "TCP": "TURN-TCP",
    "TLS": "TURN-TLS",
    "DTLS": "TURN-DTLS",
}
UDP_FAMILY = frozenset({"TURN-UDP", "TURN-DTLS"})
TLS_PROTOCOLS = frozenset({"TURN-TLS", "TURN-DTLS"})
DEFAULT_HEALTHCHECK = "http://:8086"
METRICS_ENDPOINT = "http://:8080/metrics"

ClusterFn = Callable[[View, Route], ClusterRender]


@dataclass(frozen=True, slots=True)
class GatewayRender:
    """Everything one Gateway renders to. ``status is None`` means the Gateway is not ours."""

    key: ObjKey
    config: StunnerConfig | None
    status: GatewayStatus | None
    service: dict[str, Any] | None
    deployment: dict[str, Any] | None
    deletes: tuple[ObjKey, ...]
    error: str | None
    deps: frozenset[ObjKey]
    referencing_routes: frozenset[ObjKey]
    unprogrammed: tuple[tuple[str, str], ...] = ()
    """(listener name, why) for every listener left out of the config."""
    warnings: tuple[str, ...] = ()
    """Problems that did not stop the render (malformed annotations); also in the status."""

    @property
    def config_id(self) -> str:
        return f"{self.key[1]}/{self.key[2]}"


def _invalidated(
    gw: Gateway,
    key: ObjKey,
    error: str,
    options: RenderOptions,
    view: View,
    refs: frozenset[ObjKey],
) -> GatewayRender:
    listeners = tuple(
        ListenerStatus(
            ls.name,
            0,
            (
                unknown("Accepted", "Pending", "gateway is invalid"),
                false("Conflicted", "NoConflicts"),
                true("ResolvedRefs", "ResolvedRefs"),
            ),
        )
        for ls in gw.spec.listeners
    )
    status = GatewayStatus(
        gw.metadata.generation,
        (
            false("Accepted", "Pending", error),
            false(
                "Programmed",
                "Invalid",
                f"error processing gateway by controller {options.controller_name}: {error}",
            ),
        ),
        listeners,
    )
    ns, name = key[1], key[2]
    return GatewayRender(
        key,
        None,
        status,
        None,
        None,
        (("Service", ns, name), ("Deployment", ns, name), ("DaemonSet", ns, name)),
        error,
        frozenset(view.deps),
        refs,
    )


class _GatewayInvalid(Exception):
    """The Gateway cannot be rendered: it is invalidated with this message (``_invalidated``)."""


def render_gateway(
    view: View, gw: Gateway, options: RenderOptions, cluster_for: ClusterFn
) -> GatewayRender:
    ns, name = gw.metadata.namespace, gw.metadata.name
    key: ObjKey = ("Gateway", ns, name)
    view.deps.add(key)
    hierarchy = resolve_hierarchy(view, gw.spec.gateway_class_name, options)
    routes = view.routes_of(ns, name)
    refs = frozenset(key_of(r) for r in routes)
    if hierarchy is None:
        return GatewayRender(key, None, None, None, None, (), None, frozenset(view.deps), refs)
    if hierarchy.error is not None:
        return _invalidated(gw, key, hierarchy.error, options, view, refs)
    try:
        return _render_valid(view, gw, hierarchy, routes, options, cluster_for, refs)
    except _GatewayInvalid as err:
        return _invalidated(gw, key, str(err), options, view, refs)


def _render_valid(
    view: View,
    gw: Gateway,
    hierarchy: Hierarchy,
    routes: list[Route],
    options: RenderOptions,
    cluster_for: ClusterFn,
    refs: frozenset[ObjKey],
) -> GatewayRender:
    ns, name = gw.metadata.namespace, gw.metadata.name
    gwconfig, dataplane = hierarchy.gwconfig, hierarchy.dataplane
    assert gwconfig is not None
    assert dataplane is not None
    try:
        auth = render_auth(view, gwconfig)
    except AuthError as err:
        raise _GatewayInvalid(err.message) from err

    annotations = merged_annotations(gw, gwconfig)
    targetports = TargetPorts.decode(annotations)
    warnings = tuple(
        annotation_problems(annotations, [ls.name for ls in gw.spec.listeners])
        + dataplane_problems(dataplane)
    )
    states = _check_listeners(view, gw, targetports, options)
    service = _expose(view, gw, states, annotations, targetports)
    attached = _attach_routes(view, gw, routes, states)
    listener_cfgs = _listener_configs(ns, name, states, targetports, annotations)
    clusters: list[ClusterConfig] = []
    for rid in sorted({r for cfg in listener_cfgs for r in cfg.routes}):
        cluster = cluster_for(view, attached[rid]).cluster
        if cluster is not None:
            clusters.append(cluster)
    try:
        config = StunnerConfig(
            version="v1",
            admin=_admin(ns, name, gwconfig, dataplane),
            auth=auth,
            listeners=tuple(sorted(listener_cfgs, key=lambda c: c.name)),
            clusters=tuple(clusters),
        )
    except (ConfigError, ValueError) as err:
        raise _GatewayInvalid(f"rendered dataplane config is invalid: {err}") from err

    status = _gateway_status(gw, states, options, warnings)
    deletes: tuple[ObjKey, ...] = ()
    deployment: dict[str, Any] | None = render_deployment(
        gw, dataplane, annotations, options, targetports
    )
    if is_true(annotations.get(DISABLE_MANAGED_DATAPLANE)):
        deletes = ((workload_kind(dataplane), ns, name),)
        deployment = None
    return GatewayRender(
        ("Gateway", ns, name),
        config,
        status,
        service,
        deployment,
        deletes,
        None,
        frozenset(view.deps),
        refs,
        tuple((st.spec.name, st.why_not()) for st in states if not st.renderable),
        warnings,
    )


def _check_listeners(
    view: View, gw: Gateway, targetports: TargetPorts, options: RenderOptions
) -> list[_ListenerState]:
    """Listeners in spec order: protocol, then port conflicts per transport family, then TLS.

    A listener takes two ports of its family: its Service port (spec.port) and the port
    stunnerd binds (the targetport annotation, else spec.port); either may clash.
    """
    states: list[_ListenerState] = []
    service_ports: dict[tuple[bool, int], _ListenerState] = {}
    bound_ports: dict[tuple[bool, int], _ListenerState] = {}
    for ls in gw.spec.listeners:
        st = _ListenerState(ls, PROTOCOLS.get(ls.protocol.upper()))
        states.append(st)
        if st.protocol is None:
            continue
        udp = st.protocol in UDP_FAMILY
        bound = targetports.bound_port(ls.name, ls.port)
        if _conflicts(st, udp, bound, service_ports, bound_ports):
            continue
        service_ports[(udp, ls.port)] = st
        bound_ports[(udp, bound)] = st
        if st.protocol in TLS_PROTOCOLS:
            st.cert, problem, reason = _tls_material(view, gw, ls, options)
            if st.cert is None:
                st.tls_error, st.tls_reason = problem, reason
    return states


def _conflicts(
    st: _ListenerState,
    udp: bool,
    bound: int,
    service_ports: dict[tuple[bool, int], _ListenerState],
    bound_ports: dict[tuple[bool, int], _ListenerState],
) -> bool:
    """Mark ``st`` conflicted when an earlier listener holds its Service or bound port."""
    family = "UDP" if udp else "TCP"
    port = st.spec.port
    other = service_ports.get((udp, port))
    if other is not None:
        st.conflict = f"port {port}/{family} is already used by listener {other.spec.name}"
    elif (other := bound_ports.get((udp, bound))) is not None:
        st.conflict = (
            f"target port {bound}/{family} (annotation {TARGETPORT_ANNOTATION}) is already used "
            f"by listener {other.spec.name}"
        )
    if other is None:
        return False
    st.conflict_reason = "ProtocolConflict" if other.protocol != st.protocol else "PortConflict"
    return True


def _expose(
    view: View,
    gw: Gateway,
    states: list[_ListenerState],
    annotations: dict[str, str],
    targetports: TargetPorts,
) -> dict[str, Any] | None:
    """The Gateway's Service; marks the listeners it exposes and their public addresses."""
    candidates = [
        ExposedListener(st.spec, "UDP" if st.protocol in UDP_FAMILY else "TCP")
        for st in states
        if st.renderable
    ]
    exposed = exposed_listeners(candidates, annotations)
    stored_svc = _public_service(view, gw)
    service = render_service(gw, exposed, annotations, stored_svc, targetports)
    for item in exposed:
        st = next(s for s in states if s.spec is item.listener)
        st.exposed = True
        st.public = _public_address(
            view, gw, item.listener, item.service_protocol, stored_svc, service
        )
    return service


def _attach_routes(
    view: View, gw: Gateway, routes: list[Route], states: list[_ListenerState]
) -> dict[str, Route]:
    """Every (route, parentRef) pair a listener accepts counts once; renderable listeners get
    the route. Returns the attached routes by id."""
    attached: dict[str, Route] = {}
    for route in routes:
        if is_masked(view, route):
            continue
        for ref in route.spec.parent_refs:
            if not parent_names(ref, route, gw):
                continue
            for st in states:
                if st.protocol is None or st.tls_error is not None:
                    continue
                if not ref_attaches(view, ref, route, gw, st.spec):
                    continue
                st.attached += 1
                if st.renderable:
                    rid = route_id(route)
                    st.routes.add(rid)
                    attached[rid] = route
    return attached


def _listener_configs(
    ns: str,
    name: str,
    states: list[_ListenerState],
    targetports: TargetPorts,
    annotations: dict[str, str],
) -> list[ListenerConfig]:
    listener_cfgs = []
    for st in states:
        if not st.renderable:
            continue
        try:
            listener_cfgs.append(_listener_config(ns, name, st, targetports))
        except (ConfigError, ValueError) as err:
            if st.cert is None:
                raise _GatewayInvalid(f"listener {st.spec.name} is invalid: {err}") from err
            st.tls_error = f"listener {st.spec.name}: unusable TLS certificate or key ({err})"
            st.attached = 0
    if is_true(annotations.get(RELAY_ADDRESS_DISCOVERY)):
        # The CDS gives each stunnerd its Node's external address here (by STUNNER_NODENAME),
        # so relay candidates carry the node's public IP (host networking, no LoadBalancer).
        listener_cfgs = [
            cfg.model_copy(update={"address": NODE_ADDRESS_PLACEHOLDER}) for cfg in listener_cfgs
        ]
    return listener_cfgs


def _admin(ns: str, name: str, gwconfig: GatewayConfig, dataplane: Dataplane) -> AdminConfig:
    dp = dataplane.spec
    # v1alpha1 GatewayConfigs name the endpoint (a v1alpha1-only field, so kept as an extra of
    # the shared model); v1 Dataplanes switch the default one on.
    named = (gwconfig.spec.model_extra or {}).get("metricsEndpoint")
    metrics = named if isinstance(named, str) and named else ""
    if not metrics and dp.enable_metrics_endpoint:
        metrics = METRICS_ENDPOINT
    return AdminConfig(
        name=f"{ns}/{name}",
        loglevel=gwconfig.spec.log_level or "all:INFO",
        metrics_endpoint=metrics,
        user_quota=gwconfig.spec.user_quota or 0,
        healthcheck_endpoint="" if dp.disable_health_check else DEFAULT_HEALTHCHECK,
        offload_engine=cast(OffloadEngine, dp.offload_engine or "None"),
        offload_interfaces=tuple(sorted(dp.offload_interfaces)),
    )


def _gateway_accepted(states: list[_ListenerState], message: str) -> Condition:
    """Accepted, with reason ListenersNotValid where listeners are rejected (unsupported
    protocol, port conflict): False when every listener is."""
    rejected = [st.spec.name for st in states if st.protocol is None or st.conflict is not None]
    if not rejected:
        return true("Accepted", "Accepted", message)
    if len(rejected) == len(states):
        return false(
            "Accepted",
            "ListenersNotValid",
            f"no listener is valid ({', '.join(rejected)}: see the listeners' conditions)",
        )
    return true(
        "Accepted", "ListenersNotValid", f"{message}; listener(s) {', '.join(rejected)} invalid"
    )


def _gateway_status(
    gw: Gateway, states: list[_ListenerState], options: RenderOptions, warnings: tuple[str, ...]
) -> GatewayStatus:
    message = f"gateway accepted by controller {options.controller_name}"
    if warnings:
        message += "; ignored: " + "; ".join(warnings)
    accepted = _gateway_accepted(states, message)
    missing = [st for st in states if st.public is None]
    if not missing:
        programmed = true(
            "Programmed", "Programmed", "dataplane configuration successfully rendered"
        )
    else:
        hints = []
        unexposed = [st.spec.name for st in missing if st.renderable and not st.exposed]
        waiting = [st.spec.name for st in missing if st.exposed]
        invalid = [st.spec.name for st in missing if st.protocol is None]
        conflicted = [st.spec.name for st in missing if st.conflict is not None]
        no_cert = [st.spec.name for st in missing if st.tls_error is not None]
        if conflicted:
            hints.append(f"listener(s) {', '.join(conflicted)} conflict on a port")
        if no_cert:
            hints.append(f"listener(s) {', '.join(no_cert)} have no usable TLS certificate")
        if unexposed:
            hints.append(
                f"listener(s) {', '.join(unexposed)} not exposed by the Service "
                f'(set the {MIXED_PROTOCOL}: "true" annotation to expose UDP and TCP together)'
            )
        if waiting:
            svc = f"{gw.metadata.namespace}/{gw.metadata.name}"
            hints.append(
                f"listener(s) {', '.join(waiting)} waiting for a public address on Service {svc} "
                "(or set spec.addresses)"
            )
        if invalid:
            hints.append(f"listener(s) {', '.join(invalid)} invalid")
        programmed = false("Programmed", "AddressNotAssigned", "; ".join(hints))
    addresses: tuple[tuple[str, str], ...] = ()
    for st in states:
        if st.public is not None:
            addresses = ((st.public[0], st.public[1]),)
    if addresses and addresses[0][1] in hinted_ips(gw):
        # a Gateway hinting IPs of both families is reachable on the other family's too
        family = address_family(addresses[0][1])
        other = next((ip for ip in hinted_ips(gw) if address_family(ip) != family), None)
        if other is not None:
            addresses += (("IPAddress", other),)
    return GatewayStatus(
        gw.metadata.generation,
        (accepted, programmed),
        tuple(_listener_status(st) for st in states),
        addresses,
    )
