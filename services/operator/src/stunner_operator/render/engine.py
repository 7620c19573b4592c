"""The incremental renderer: objects in, per-Gateway configs and object statuses out.

Every render of a Gateway, a route status or a class status records the keys it read (see
``store.View``); the engine keeps the reverse index from each key to the renders that read it.
An event (objects upserted or deleted) touches a few keys, and only the renders that read them
run again. ``render_all`` renders everything, which is what a fresh start does. The engine is
pure: no I/O, no clock; the result of ``apply`` is the delta the caller publishes.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stunner_common.config import StunnerConfig
from stunner_common.crds import (
    Gateway,
    GatewayClass,
    K8sObject,
    ParentReference,
    UDPRoute,
    UDPRouteV1A2,
)
from stunner_operator.render.clusters import BackendProblem, ClusterRender, render_cluster
from stunner_operator.render.gateway import (
    PROTOCOLS,
    ClusterFn,
    GatewayRender,
    class_status,
    render_gateway,
    resolve_hierarchy,
)
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.routes import (
    is_masked,
    parent_is_gateway,
    ref_attaches,
    rejection_reason,
)
from stunner_operator.render.service import echoes_assigned_ports
from stunner_operator.render.status import (
    Condition,
    GatewayClassStatus,
    ParentRef,
    RouteParentStatus,
    RouteStatus,
    Status,
    false,
    true,
)
from stunner_operator.render.store import ObjectStore, ObjKey, Route, View, key_of

ROUTE_KINDS = ("UDPRoute", "UDPRouteV1A2")
S = TypeVar("S", RouteStatus, GatewayClassStatus)
BIG_BATCH = 64
"""Renders of more objects than this run with the cyclic GC paused (see ``_gc_paused``)."""


@contextmanager
def _gc_paused(pause: bool) -> Iterator[None]:
    """Pause the cyclic garbage collector for one large render.

    A full render allocates many short-lived objects while thousands of long-lived ones sit in
    the store, so generation-2 collections keep re-scanning the store: about a third of a full
    render's time. The render is bounded, and collection resumes right after it.
    """
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(frozen=True, slots=True)
class RenderDelta:
    """What one ``apply``/``render_all`` changed.

    ``configs`` holds new or changed configs by id ("ns/gateway"), ``deleted`` the ids that no
    longer have one. ``statuses`` maps object keys to their new status (None: we no longer set
    one). ``services``/``deployments`` map Gateway ids to the desired object (None: none wanted),
    and ``resource_deletes`` lists the Services/Deployments that should not exist.
    """

    configs: Mapping[str, StunnerConfig] = field(default_factory=dict)
    deleted: frozenset[str] = frozenset()
    statuses: Mapping[ObjKey, Status | None] = field(default_factory=dict)
    services: Mapping[str, dict[str, Any] | None] = field(default_factory=dict)
    deployments: Mapping[str, dict[str, Any] | None] = field(default_factory=dict)
    resource_deletes: frozenset[ObjKey] = frozenset()
    rendered_gateways: int = 0

    @property
    def configs_changed(self) -> bool:
        return bool(self.configs or self.deleted)


def _accepted_by(
    view: View, ref: ParentReference, route: Route, gw: Gateway, render: GatewayRender
) -> Condition:
    """The route's Accepted condition for one parent: attached to a listener that is served?"""
    gid = f"{gw.metadata.namespace}/{gw.metadata.name}"
    admitting = [ls for ls in gw.spec.listeners if ref_attaches(view, ref, route, gw, ls)]
    listeners = [ls.name for ls in admitting if PROTOCOLS.get(ls.protocol.upper()) is not None]
    if not listeners and admitting:
        # The route would attach, but to listeners the Gateway rejects: say that, not policy.
        bad = ", ".join(f"{ls.name} (unsupported protocol {ls.protocol!r})" for ls in admitting)
        return false(
            "Accepted",
            "NotAllowedByListeners",
            f"parent {gid} rejects every listener that would take the route: {bad}",
        )
    if not listeners:
        return false("Accepted", "NotAllowedByListeners", rejection_reason(view, ref, route, gw))
    left_out = dict(render.unprogrammed)
    if any(name not in left_out for name in listeners):
        return true("Accepted", "Accepted", f"parent {gid} accepted the route")
    why = "; ".join(f"{name}: {left_out[name]}" for name in listeners)
    return false(
        "Accepted",
        "Pending",
        f"parent {gid} takes the route only on listener(s) left out of its dataplane config "
        f"({why}); no client can reach the route's backends",
    )


@dataclass(slots=True)
class _DeltaBuilder:
    """A `RenderDelta` as one render collects it."""

    configs: dict[str, StunnerConfig] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    statuses: dict[ObjKey, Status | None] = field(default_factory=dict)
    services: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    deployments: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    resource_deletes: set[ObjKey] = field(default_factory=set)
    rendered: int = 0

    def workloads(self, key: ObjKey, old: GatewayRender | None, new: GatewayRender | None) -> None:
        """The Gateway's Service and Deployment (or DaemonSet) where they changed."""
        cid = f"{key[1]}/{key[2]}"
        old_svc = old.service if old is not None else None
        new_svc = new.service if new is not None else None
        if old_svc != new_svc and not echoes_assigned_ports(old_svc, new_svc):
            self.services[cid] = new_svc
        old_dep = old.deployment if old is not None else None
        new_dep = new.deployment if new is not None else None
        if old_dep != new_dep:
            self.deployments[cid] = new_dep
        # No longer wanted (the Gateway went to another class, lost its GatewayConfig, or was
        # deleted): remove them now rather than leave them to the garbage collector, which
        # only acts once the Gateway itself is gone.
        if old_svc is not None and new_svc is None:
            self.resource_deletes.add(("Service", key[1], key[2]))
        if old_dep is not None and (new_dep is None or old_dep["kind"] != new_dep["kind"]):
            # gone, or dataplaneResource changed: a Deployment gives way to a DaemonSet, or back
            self.resource_deletes.add((old_dep["kind"], key[1], key[2]))
        if new is not None:
            self.resource_deletes.update(new.deletes)

    def build(self) -> RenderDelta:
        return RenderDelta(
            configs=self.configs,
            deleted=frozenset(self.deleted),
            statuses=self.statuses,
            services=self.services,
            deployments=self.deployments,
            resource_deletes=frozenset(self.resource_deletes),
            rendered_gateways=self.rendered,
        )


class Renderer:
    """Holds the object store and the last render of every Gateway, route and class."""

    def __init__(self, options: RenderOptions | None = None) -> None:
        self.options = options or RenderOptions()
        self.store = ObjectStore()
        self._gateways: dict[ObjKey, GatewayRender] = {}
        self._config_json: dict[str, str] = {}
        self._route_status: dict[ObjKey, RouteStatus | None] = {}
        self._class_status: dict[ObjKey, GatewayClassStatus | None] = {}
        # The uid of the object each status was last emitted for: an object deleted and created
        # again between two renders (one batch) is a new object whose status is the API
        # server's default until written, even when the render is unchanged.
        self._status_uid: dict[ObjKey, str] = {}
        self._deps: dict[ObjKey, frozenset[ObjKey]] = {}  # render key -> keys it read
        self._rev: dict[ObjKey, set[ObjKey]] = defaultdict(set)  # key read -> render keys

    # -- queries ---------------------------------------------------------------------------

    def configs(self) -> dict[str, StunnerConfig]:
        """Every current config by id ("ns/gateway")."""
        return {r.config_id: r.config for r in self._gateways.values() if r.config is not None}

    def gateway(self, namespace: str, name: str) -> GatewayRender | None:
        return self._gateways.get(("Gateway", namespace, name))

    def gateway_renders(self) -> list[GatewayRender]:
        """The last render of every Gateway in the store, sorted by key."""
        return [self._gateways[key] for key in sorted(self._gateways)]

    def statuses(self) -> dict[ObjKey, Status]:
        out: dict[ObjKey, Status] = {}
        for key, render in self._gateways.items():
            if render.status is not None:
                out[key] = render.status
        for key, rstatus in self._route_status.items():
            if rstatus is not None:
                out[key] = rstatus
        for key, cstatus in self._class_status.items():
            if cstatus is not None:
                out[key] = cstatus
        return out

    # -- updates ---------------------------------------------------------------------------

    def apply(
        self, upserts: Iterable[K8sObject] = (), deletes: Iterable[ObjKey] = ()
    ) -> RenderDelta:
        """Store the changes, re-render what they affect, and return what changed."""
        touched: set[ObjKey] = set()
        for obj in upserts:
            touched |= self.store.upsert(obj)
        for key in deletes:
            touched |= self.store.delete(key)
        return self._render(touched, everything=False)

    def render_all(self) -> RenderDelta:
        return self._render(set(), everything=True)

    # -- internals -------------------------------------------------------------------------

    def _render(self, touched: set[ObjKey], *, everything: bool) -> RenderDelta:
        store = self.store
        dirty: set[ObjKey] = set()
        for key in touched:
            dirty.update(self._rev.get(key, ()))
        if everything:
            dirty.update(("Gateway", ns, n) for ns, n in store.keys("Gateway"))
            dirty.update(self._gateways)
            for kind in ROUTE_KINDS:
                dirty.update((kind, ns, n) for ns, n in store.keys(kind))
            dirty.update(("GatewayClass", ns, n) for ns, n in store.keys("GatewayClass"))
        dirty.update(k for k in touched if k[0] in ("Gateway", "GatewayClass", *ROUTE_KINDS))
        with _gc_paused(len(dirty) > BIG_BATCH):
            return self._render_dirty(dirty)

    def _render_dirty(self, dirty: set[ObjKey]) -> RenderDelta:
        cluster_for = self._cluster_memo()
        acc = _DeltaBuilder()
        # Gateways first: route statuses read the Gateway renders.
        for key in sorted(k for k in dirty if k[0] == "Gateway"):
            dirty |= self._render_gateway_key(key, acc, cluster_for)
        for key in sorted(k for k in dirty if k[0] in ROUTE_KINDS):
            self._render_route_key(key, acc, cluster_for)
        for key in sorted(k for k in dirty if k[0] == "GatewayClass"):
            self._render_class_key(key, acc)
        return acc.build()

    def _cluster_memo(self) -> ClusterFn:
        """``render_cluster`` memoised for one render: each route's cluster is rendered once,
        and every view that asks for it records what the cluster render read."""
        store = self.store
        memo: dict[ObjKey, tuple[ClusterRender, frozenset[ObjKey]]] = {}

        def cluster_for(view: View, route: Route) -> ClusterRender:
            rkey = key_of(route)
            hit = memo.get(rkey)
            if hit is None:
                sub = View(store)
                hit = (render_cluster(sub, route, self.options), frozenset(sub.deps))
                memo[rkey] = hit
            view.deps.update(hit[1])
            return hit[0]

        return cluster_for

    def _render_gateway_key(
        self, key: ObjKey, acc: _DeltaBuilder, cluster_for: ClusterFn
    ) -> set[ObjKey]:
        """Render one Gateway into ``acc``; returns the routes to render again."""
        old = self._gateways.get(key)
        gw = self.store.get(Gateway, key[1], key[2])
        new: GatewayRender | None = None
        if gw is None:
            self._gateways.pop(key, None)
            self._set_deps(key, frozenset())
        else:
            new = render_gateway(View(self.store), gw, self.options, cluster_for)
            acc.rendered += 1
            self._gateways[key] = new
            self._set_deps(key, new.deps)
        cid = f"{key[1]}/{key[2]}"
        config = new.config if new is not None else None
        text = config.canonical_json() if config else None
        if text is None:
            if self._config_json.pop(cid, None) is not None:
                acc.deleted.add(cid)
        elif self._config_json.get(cid) != text:
            self._config_json[cid] = text
            assert config is not None
            acc.configs[cid] = config
        old_status = old.status if old is not None else None
        new_status = new.status if new is not None else None
        replaced = self._replaced(key, gw)  # records the uid whatever the status did
        if old_status != new_status or replaced:
            acc.statuses[key] = new_status
        acc.workloads(key, old, new)
        return {r for render in (old, new) if render is not None for r in render.referencing_routes}

    def _render_route_key(self, key: ObjKey, acc: _DeltaBuilder, cluster_for: ClusterFn) -> None:
        model: type[Route] = UDPRoute if key[0] == "UDPRoute" else UDPRouteV1A2
        route = self.store.get(model, key[1], key[2])
        rstatus: RouteStatus | None = None
        if route is None:
            self._set_deps(key, frozenset())
        else:
            view = View(self.store)
            rstatus = self._route_status_of(view, route, cluster_for)
            self._set_deps(key, frozenset(view.deps))
        self._record(self._route_status, key, rstatus, route, acc)

    def _render_class_key(self, key: ObjKey, acc: _DeltaBuilder) -> None:
        cstatus: GatewayClassStatus | None = None
        gwc = self.store.get(GatewayClass, "", key[2])
        if gwc is None:
            self._set_deps(key, frozenset())
        else:
            view = View(self.store)
            hierarchy = resolve_hierarchy(view, key[2], self.options)
            cstatus = class_status(hierarchy, self.options) if hierarchy else None
            self._set_deps(key, frozenset(view.deps))
        self._record(self._class_status, key, cstatus, gwc, acc)

    def _record(
        self,
        table: dict[ObjKey, S | None],
        key: ObjKey,
        status: S | None,
        obj: K8sObject | None,
        acc: _DeltaBuilder,
    ) -> None:
        """Keep ``status`` as ``key``'s last one; emit it when it changed (or the object was
        replaced)."""
        replaced = self._replaced(key, obj)  # records the uid whatever the status did
        if table.get(key) != status or replaced:
            acc.statuses[key] = status
        if status is None:
            table.pop(key, None)
        else:
            table[key] = status

    def _replaced(self, key: ObjKey, obj: K8sObject | None) -> bool:
        """Whether ``obj`` is another object than the one ``key``'s status was last emitted for
        (deleted and created again under the same name); records its uid either way."""
        uid = obj.metadata.uid if obj is not None else ""
        before = self._status_uid.pop(key, None)
        if obj is not None:
            self._status_uid[key] = uid
        return bool(uid) and before is not None and before != uid

    def _set_deps(self, render_key: ObjKey, deps: frozenset[ObjKey]) -> None:
        old = self._deps.get(render_key, frozenset())
        for key in old - deps:
            users = self._rev.get(key)
            if users is not None:
                users.discard(render_key)
                if not users:
                    del self._rev[key]
        for key in deps - old:
            self._rev[key].add(render_key)
        if deps:
            self._deps[render_key] = deps
        else:
            self._deps.pop(render_key, None)

    def _route_status_of(
        self, view: View, route: Route, cluster_for: ClusterFn
    ) -> RouteStatus | None:
        rns = route.metadata.namespace
        masked = is_masked(view, route)
        parents: list[RouteParentStatus] = []
        ours = False
        problems: tuple[BackendProblem, ...] | None = None
        seen: set[ParentRef] = set()
        for ref in route.spec.parent_refs:
            if not parent_is_gateway(ref):
                continue
            pref = ParentRef(
                name=ref.name,
                namespace=ref.namespace,
                section_name=ref.section_name,
                group=ref.group if ref.group not in (None, "gateway.networking.k8s.io") else None,
                kind=ref.kind if ref.kind not in (None, "Gateway") else None,
                port=ref.port,
            )
            if pref in seen:
                continue
            seen.add(pref)
            gns = ref.namespace or rns
            gid = f"{gns}/{ref.name}"
            gw = view.get(Gateway, gns, ref.name)
            if gw is None:
                accepted = false("Accepted", "NoMatchingParent", f"parent {gid} does not exist")
            else:
                render = self._gateways.get(("Gateway", gns, ref.name))
                if render is None or render.status is None:
                    continue  # another controller's Gateway: its status is not ours to write
                ours = True
                if masked:
                    accepted = false(
                        "Accepted",
                        "Pending",
                        "GwAPI.v1 UDPRoute masked by a STUNnerV1 UDPRoute of the same name",
                    )
                elif render.error is not None:
                    accepted = false(
                        "Accepted", "Pending", f"parent {gid} is invalid: {render.error}"
                    )
                else:
                    accepted = _accepted_by(view, ref, route, gw, render)
            if problems is None:
                problems = cluster_for(view, route).problems
            if problems:
                resolved = false(
                    "ResolvedRefs",
                    problems[-1].reason,
                    "; ".join(p.message for p in problems),
                )
            else:
                resolved = true(
                    "ResolvedRefs", "ResolvedRefs", "all backend references successfully resolved"
                )
            parents.append(RouteParentStatus(pref, (accepted, resolved)))
        if not ours:
            return None
        return RouteStatus(route.metadata.generation, rns, tuple(parents))
