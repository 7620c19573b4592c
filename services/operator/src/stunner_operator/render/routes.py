"""Which listeners a UDPRoute attaches to, and the route's status.

The rules are Gateway API's (https://gateway-api.sigs.k8s.io/reference/spec/).

A parentRef attaches a route to a listener when it names the Gateway (namespace defaulting to the
route's), its ``sectionName`` (if any) names the listener, and the listener's
``allowedRoutes.namespaces`` admits the route's namespace: ``Same`` (the default), ``All``, or a
label ``Selector`` evaluated against the route's Namespace (a namespace with no stored object has
only the ``kubernetes.io/metadata.name`` label every namespace carries). Unlike upstream, this
policy is enforced exactly as GATEWAY.md documents it.
"""

from __future__ import annotations

from stunner_common.crds import (
    GATEWAY_GROUP,
    STUNNER_GROUP,
    Gateway,
    Listener,
    Namespace,
    ParentReference,
    UDPRoute,
    UDPRouteV1A2,
)
from stunner_operator.render.status import SUPPORTED_KINDS, RouteKind
from stunner_operator.render.store import Route, View

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def is_masked(view: View, route: Route) -> bool:
    """A v1alpha2 route is ignored when a stunner v1 route has the same namespace and name."""
    if not isinstance(route, UDPRouteV1A2):
        return False
    return view.get(UDPRoute, route.metadata.namespace, route.metadata.name) is not None


def parent_is_gateway(ref: ParentReference) -> bool:
    return (ref.group or GATEWAY_GROUP) == GATEWAY_GROUP and (ref.kind or "Gateway") == "Gateway"


def parent_names(ref: ParentReference, route: Route, gw: Gateway) -> bool:
    return (
        parent_is_gateway(ref)
        and (ref.namespace or route.metadata.namespace) == gw.metadata.namespace
        and ref.name == gw.metadata.name
    )


def namespace_labels(view: View, namespace: str) -> dict[str, str]:
    ns = view.get(Namespace, "", namespace)
    labels = dict(ns.metadata.labels) if ns is not None else {}
    labels.setdefault(NAMESPACE_NAME_LABEL, namespace)
    return labels


def listener_admits_namespace(view: View, listener: Listener, gw: Gateway, route_ns: str) -> bool:
    policy = listener.allowed_routes.namespaces
    if policy.from_ == "All":
        return True
    if policy.from_ == "Same":
        return route_ns == gw.metadata.namespace
    if policy.selector is None:
        return False
    return policy.selector.matches(namespace_labels(view, route_ns))


def allowed_kinds(listener: Listener) -> tuple[tuple[RouteKind, ...], tuple[RouteKind, ...]]:
    """The route kinds ``listener`` takes (its ``allowedRoutes.kinds`` that we serve, all of
    ours when it names none) and the ones it names that we do not serve."""
    if not listener.allowed_routes.kinds:
        return SUPPORTED_KINDS, ()
    named = [
        (k.group if k.group is not None else GATEWAY_GROUP, k.kind)
        for k in listener.allowed_routes.kinds
    ]
    return (
        tuple(k for k in SUPPORTED_KINDS if k in named),
        tuple(k for k in named if k not in SUPPORTED_KINDS),
    )


def route_kind(route: Route) -> RouteKind:
    return (
        (STUNNER_GROUP, "UDPRoute") if isinstance(route, UDPRoute) else (GATEWAY_GROUP, "UDPRoute")
    )


def ref_attaches(
    view: View, ref: ParentReference, route: Route, gw: Gateway, listener: Listener
) -> bool:
    if not parent_names(ref, route, gw):
        return False
    if ref.section_name is not None and ref.section_name != listener.name:
        return False
    if ref.port is not None and ref.port != listener.port:
        return False
    if route_kind(route) not in allowed_kinds(listener)[0]:
        return False
    return listener_admits_namespace(view, listener, gw, route.metadata.namespace)


def rejection_reason(view: View, ref: ParentReference, route: Route, gw: Gateway) -> str:
    """Why no listener of ``gw`` takes ``ref`` (for the route status message)."""
    gid = f"{gw.metadata.namespace}/{gw.metadata.name}"
    listeners = gw.spec.listeners
    if ref.section_name is not None:
        named = [ls for ls in listeners if ls.name == ref.section_name]
        if not named:
            return f"parent {gid} has no listener named {ref.section_name!r}"
        listeners = tuple(named)
    if ref.port is not None:
        listeners = tuple(ls for ls in listeners if ls.port == ref.port)
        if not listeners:
            return f"parent {gid} has no listener on port {ref.port}"
    if not listeners:
        return f"parent {gid} has no listeners"
    kind = route_kind(route)
    if not any(kind in allowed_kinds(ls)[0] for ls in listeners):
        return f"parent {gid} has no listener that allows {kind[1]}s of group {kind[0]}"
    return (
        f"parent {gid} rejects the route: no listener allows routes from namespace "
        f"{route.metadata.namespace!r} (see listeners[].allowedRoutes)"
    )
