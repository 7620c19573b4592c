"""The in-memory object store the renderer reads, with the indexes that make rendering incremental.

Objects are keyed ``(kind, namespace, name)``. Besides direct look-ups, the renderer asks a few
"list" questions (the routes that name a Gateway, the EndpointSlices of a Service, the Services
related to a Gateway, all Nodes). Each such question has a *virtual key*, and ``dirty_keys``
reports which real and virtual keys an upsert or delete touches. A ``View`` records every key a
render read, so the engine knows exactly which renders an event can change.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from stunner_common.crds import (
    EndpointSlice,
    Gateway,
    K8sObject,
    Node,
    ReferenceGrant,
    Service,
    UDPRoute,
    UDPRouteV1A2,
    kind_of,
    model_kind,
)

ObjKey = tuple[str, str, str]
"""``(kind, namespace, name)``; cluster-scoped objects have namespace ``""``."""

T = TypeVar("T", bound=K8sObject)

RELATED_GATEWAY_ANNOTATION = "stunner.l7mp.io/related-gateway-name"

# Virtual keys: the answer to a "list" question changes.
ROUTES_OF = "routes-of"  # (ROUTES_OF, gw-ns, gw-name): routes whose parentRefs name the Gateway
SLICES_OF = "slices-of"  # (SLICES_OF, ns, service): EndpointSlices of a Service
SERVICES_OF = "services-of"  # (SERVICES_OF, gw-ns, gw-name): Services related to a Gateway
GRANTS_IN = "grants-in"  # (GRANTS_IN, ns, ""): the ReferenceGrants of a namespace
ALL_NODES: ObjKey = ("all-nodes", "", "")

Route = UDPRoute | UDPRouteV1A2


def key_of(obj: K8sObject) -> ObjKey:
    return (kind_of(obj), obj.metadata.namespace, obj.metadata.name)


def route_parent_keys(route: Route) -> set[tuple[str, str]]:
    """The Gateways (namespace, name) a route's parentRefs name, whatever their group and kind."""
    ns = route.metadata.namespace
    return {(ref.namespace or ns, ref.name) for ref in route.spec.parent_refs}


def related_gateway(svc: Service) -> tuple[str, str] | None:
    value = svc.metadata.annotations.get(RELATED_GATEWAY_ANNOTATION, "")
    ns, sep, name = value.partition("/")
    if not sep or not ns or not name:
        return None
    return (ns, name)


class ObjectStore:
    """All objects the renderer may read, with secondary indexes kept in step."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[tuple[str, str], K8sObject]] = defaultdict(dict)
        self._routes_of: dict[tuple[str, str], set[ObjKey]] = defaultdict(set)
        self._slices_of: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._services_of: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
        self._gateways_of_class: dict[str, set[tuple[str, str]]] = defaultdict(set)

    def __len__(self) -> int:
        return sum(len(objs) for objs in self._objects.values())

    def get(self, model: type[T], namespace: str, name: str) -> T | None:
        obj = self._objects[model_kind(model)].get((namespace, name))
        return obj if isinstance(obj, model) else None

    def get_key(self, key: ObjKey) -> K8sObject | None:
        return self._objects[key[0]].get((key[1], key[2]))

    def all(self, model: type[T]) -> Iterator[T]:
        for obj in self._objects[model_kind(model)].values():
            if isinstance(obj, model):
                yield obj

    def keys(self, kind: str) -> Iterable[tuple[str, str]]:
        return self._objects[kind].keys()

    def routes_of(self, namespace: str, name: str) -> list[Route]:
        out: list[Route] = []
        for kind, ns, rname in sorted(self._routes_of.get((namespace, name), ())):
            obj = self._objects[kind].get((ns, rname))
            if isinstance(obj, UDPRoute | UDPRouteV1A2):
                out.append(obj)
        return out

    def slices_of(self, namespace: str, service: str) -> list[EndpointSlice]:
        names = sorted(self._slices_of.get((namespace, service), ()))
        slices = self._objects["EndpointSlice"]
        return [s for n in names if isinstance(s := slices.get((namespace, n)), EndpointSlice)]

    def services_of(self, namespace: str, gateway: str) -> list[Service]:
        services = self._objects["Service"]
        return [
            svc
            for key in sorted(self._services_of.get((namespace, gateway), ()))
            if isinstance(svc := services.get(key), Service)
        ]

    def nodes(self) -> list[Node]:
        return sorted(self.all(Node), key=lambda n: n.metadata.name)

    def grants_in(self, namespace: str) -> list[ReferenceGrant]:
        grants = self._objects["ReferenceGrant"]
        return [
            g
            for (ns, name) in sorted(grants)
            if ns == namespace and isinstance(g := grants[(ns, name)], ReferenceGrant)
        ]

    def gateways_of_class(self, class_name: str) -> list[Gateway]:
        gws = self._objects["Gateway"]
        return [
            gw
            for key in sorted(self._gateways_of_class.get(class_name, ()))
            if isinstance(gw := gws.get(key), Gateway)
        ]

    def upsert(self, obj: K8sObject) -> set[ObjKey]:
        """Store ``obj`` (replacing any previous version); return the keys the change touches."""
        key = key_of(obj)
        old = self._objects[key[0]].get((key[1], key[2]))
        if old is not None:
            self._unindex(key, old)
        self._objects[key[0]][(key[1], key[2])] = obj
        self._index(key, obj)
        return self._touched(key, old, obj)

    def delete(self, key: ObjKey) -> set[ObjKey]:
        old = self._objects[key[0]].pop((key[1], key[2]), None)
        if old is None:
            return set()
        self._unindex(key, old)
        return self._touched(key, old, None)

    def _touched(self, key: ObjKey, old: K8sObject | None, new: K8sObject | None) -> set[ObjKey]:
        touched = {key}
        for obj in (old, new):
            if isinstance(obj, UDPRoute | UDPRouteV1A2):
                touched.update((ROUTES_OF, ns, n) for ns, n in route_parent_keys(obj))
                # A v1 route masks (or unmasks) the v1alpha2 route of the same name.
                twin_kind = "UDPRouteV1A2" if isinstance(obj, UDPRoute) else "UDPRoute"
                touched.add((twin_kind, key[1], key[2]))
                twin = self._objects[twin_kind].get((key[1], key[2]))
                if isinstance(twin, UDPRoute | UDPRouteV1A2):
                    touched.update((ROUTES_OF, ns, n) for ns, n in route_parent_keys(twin))
            elif isinstance(obj, EndpointSlice):
                touched.add((SLICES_OF, key[1], obj.service_name))
            elif isinstance(obj, Service):
                rel = related_gateway(obj)
                if rel is not None:
                    touched.add((SERVICES_OF, *rel))
            elif isinstance(obj, Node):
                touched.add(ALL_NODES)
            elif isinstance(obj, ReferenceGrant):
                touched.add((GRANTS_IN, key[1], ""))
        return touched

    def _index(self, key: ObjKey, obj: K8sObject) -> None:
        self._update_indexes(key, obj, set.add)

    def _unindex(self, key: ObjKey, obj: K8sObject) -> None:
        self._update_indexes(key, obj, set.discard)

    def _update_indexes(
        self, key: ObjKey, obj: K8sObject, op: Callable[[set[Any], Any], None]
    ) -> None:
        """Add ``obj`` to (``set.add``) or remove it from (``set.discard``) the indexes."""
        if isinstance(obj, UDPRoute | UDPRouteV1A2):
            for parent in route_parent_keys(obj):
                op(self._routes_of[parent], key)
        elif isinstance(obj, EndpointSlice):
            op(self._slices_of[(key[1], obj.service_name)], key[2])
        elif isinstance(obj, Service):
            rel = related_gateway(obj)
            if rel is not None:
                op(self._services_of[rel], (key[1], key[2]))
        elif isinstance(obj, Gateway):
            op(self._gateways_of_class[obj.spec.gateway_class_name], (key[1], key[2]))


class View:
    """Read access to a store that records every key read, real or virtual."""

    __slots__ = ("deps", "store")

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.deps: set[ObjKey] = set()

    def get(self, model: type[T], namespace: str, name: str) -> T | None:
        self.deps.add((model_kind(model), namespace, name))
        return self.store.get(model, namespace, name)

    def routes_of(self, namespace: str, name: str) -> list[Route]:
        self.deps.add((ROUTES_OF, namespace, name))
        routes = self.store.routes_of(namespace, name)
        self.deps.update(key_of(r) for r in routes)
        return routes

    def slices_of(self, namespace: str, service: str) -> list[EndpointSlice]:
        self.deps.add((SLICES_OF, namespace, service))
        return self.store.slices_of(namespace, service)

    def services_of(self, namespace: str, gateway: str) -> list[Service]:
        self.deps.add((SERVICES_OF, namespace, gateway))
        return self.store.services_of(namespace, gateway)

    def nodes(self) -> list[Node]:
        self.deps.add(ALL_NODES)
        return self.store.nodes()

    def grants_in(self, namespace: str) -> list[ReferenceGrant]:
        self.deps.add((GRANTS_IN, namespace, ""))
        return self.store.grants_in(namespace)
