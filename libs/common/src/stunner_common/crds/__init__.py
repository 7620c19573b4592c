"""Models of the Kubernetes objects the operator reads, and one entry point to parse them.

``parse_object`` turns one decoded YAML/JSON document into the right model, chosen by API group
and kind, and names the offending field in its error. The same models serve the cluster watcher
and the local-mode folder loader, so both feed the renderer identical values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

from stunner_common.crds._base import (
    Condition,
    K8sModel,
    K8sObject,
    LabelSelector,
    LabelSelectorRequirement,
    ObjectMeta,
    OwnerReference,
)
from stunner_common.crds.core import (
    Endpoint,
    EndpointSlice,
    LoadBalancerIngress,
    Namespace,
    Node,
    NodeAddress,
    Secret,
    Service,
    ServicePort,
)
from stunner_common.crds.gateway_api import (
    GATEWAY_GROUP,
    AllowedRoutes,
    BackendRef,
    Gateway,
    GatewayAddress,
    GatewayClass,
    GatewayTLSConfig,
    Listener,
    ParentReference,
    ReferenceGrant,
    RouteGroupKind,
    RouteSpec,
    SecretObjectReference,
    UDPRouteV1A2,
)
from stunner_common.crds.stunner import (
    STUNNER_GROUP,
    Dataplane,
    DataplaneSpec,
    GatewayConfig,
    GatewayConfigSpec,
    StaticService,
    UDPRoute,
)

__all__ = [
    "CLUSTER_SCOPED_KINDS",
    "GATEWAY_GROUP",
    "STUNNER_GROUP",
    "AllowedRoutes",
    "BackendRef",
    "Condition",
    "CrdError",
    "Dataplane",
    "DataplaneSpec",
    "Endpoint",
    "EndpointSlice",
    "Gateway",
    "GatewayAddress",
    "GatewayClass",
    "GatewayConfig",
    "GatewayConfigSpec",
    "GatewayTLSConfig",
    "K8sModel",
    "K8sObject",
    "LabelSelector",
    "LabelSelectorRequirement",
    "Listener",
    "LoadBalancerIngress",
    "Namespace",
    "Node",
    "NodeAddress",
    "ObjectMeta",
    "OwnerReference",
    "ParentReference",
    "ReferenceGrant",
    "RouteGroupKind",
    "RouteSpec",
    "Secret",
    "SecretObjectReference",
    "Service",
    "ServicePort",
    "StaticService",
    "UDPRoute",
    "UDPRouteV1A2",
    "UnsupportedKindError",
    "kind_of",
    "model_kind",
    "parse_object",
]


class CrdError(ValueError):
    """A document that claims a supported kind but does not fit its schema."""


class UnsupportedKindError(CrdError):
    """A document of a kind the operator does not read (it can be skipped)."""


# (API group, kind) -> (store kind, model). The store kind tells the two UDPRoute flavours apart.
_KINDS: Final[dict[tuple[str, str], tuple[str, type[K8sObject]]]] = {
    (GATEWAY_GROUP, "GatewayClass"): ("GatewayClass", GatewayClass),
    (GATEWAY_GROUP, "Gateway"): ("Gateway", Gateway),
    (GATEWAY_GROUP, "UDPRoute"): ("UDPRouteV1A2", UDPRouteV1A2),
    (GATEWAY_GROUP, "ReferenceGrant"): ("ReferenceGrant", ReferenceGrant),
    (STUNNER_GROUP, "UDPRoute"): ("UDPRoute", UDPRoute),
    (STUNNER_GROUP, "GatewayConfig"): ("GatewayConfig", GatewayConfig),
    (STUNNER_GROUP, "Dataplane"): ("Dataplane", Dataplane),
    (STUNNER_GROUP, "StaticService"): ("StaticService", StaticService),
    ("", "Service"): ("Service", Service),
    ("", "Secret"): ("Secret", Secret),
    ("", "Node"): ("Node", Node),
    ("", "Namespace"): ("Namespace", Namespace),
    ("discovery.k8s.io", "EndpointSlice"): ("EndpointSlice", EndpointSlice),
}

CLUSTER_SCOPED_KINDS: Final = frozenset({"GatewayClass", "Dataplane", "Node", "Namespace"})

_STORE_KIND_OF_MODEL: Final[dict[type[K8sObject], str]] = {
    model: store_kind for store_kind, model in _KINDS.values()
}


def kind_of(obj: K8sObject) -> str:
    """The store kind of a parsed object (``UDPRoute`` vs ``UDPRouteV1A2`` for the two routes)."""
    return _STORE_KIND_OF_MODEL[type(obj)]


def model_kind(model: type[K8sObject]) -> str:
    """The store kind of a model class."""
    return _STORE_KIND_OF_MODEL[model]


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _describe(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(document)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def parse_object(doc: Mapping[str, Any], *, default_namespace: str = "default") -> K8sObject:
    """Parse one decoded document into its model.

    Namespaced objects that carry no namespace get ``default_namespace``, as with ``kubectl``.
    """
    if not isinstance(doc, Mapping):
        raise CrdError(f"expected a mapping, got {type(doc).__name__}")
    api_version = doc.get("apiVersion")
    kind = doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise CrdError("missing apiVersion or kind")
    entry = _KINDS.get((_group(api_version), kind))
    if entry is None:
        raise UnsupportedKindError(f"unsupported kind {kind!r} in apiVersion {api_version!r}")
    store_kind, model = entry
    try:
        obj = model.model_validate(doc)
    except ValidationError as err:
        name = ""
        meta = doc.get("metadata")
        if isinstance(meta, Mapping):
            name = str(meta.get("name", ""))
        raise CrdError(f"invalid {kind} {name!r}: {_describe(err)}") from None
    if not obj.metadata.name:
        raise CrdError(f"{kind} without metadata.name")
    if store_kind in CLUSTER_SCOPED_KINDS:
        if obj.metadata.namespace:
            meta = obj.metadata.model_copy(update={"namespace": ""})
            obj = obj.model_copy(update={"metadata": meta})
    elif not obj.metadata.namespace:
        meta = obj.metadata.model_copy(update={"namespace": default_namespace})
        obj = obj.model_copy(update={"metadata": meta})
    return obj
