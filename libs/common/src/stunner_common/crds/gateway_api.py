"""Gateway API objects the operator reads: GatewayClass, Gateway, UDPRoute and ReferenceGrant.

Only the fields STUNner uses are typed; everything else is kept as given. Defaults follow the
Gateway API CRDs (a parentRef's group and kind, a listener's ``allowedRoutes`` of ``Same``), so an
object read from a YAML file behaves like the same object read back from the API server.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stunner_common.crds._base import K8sModel, K8sObject, LabelSelector

GATEWAY_GROUP = "gateway.networking.k8s.io"


class ParametersReference(K8sModel):
    group: str = ""
    kind: str = ""
    name: str = ""
    namespace: str | None = None


class GatewayClassSpec(K8sModel):
    controller_name: str = ""
    parameters_ref: ParametersReference | None = None
    description: str = ""


class GatewayClass(K8sObject):
    spec: GatewayClassSpec = Field(default_factory=GatewayClassSpec)


class SecretObjectReference(K8sModel):
    group: str | None = None
    kind: str | None = None
    name: str = ""
    namespace: str | None = None


class GatewayTLSConfig(K8sModel):
    mode: str | None = None
    certificate_refs: tuple[SecretObjectReference, ...] = ()


class RouteNamespaces(K8sModel):
    from_: Literal["All", "Same", "Selector"] = Field(default="Same", alias="from")
    selector: LabelSelector | None = None


class RouteGroupKind(K8sModel):
    group: str | None = None  # the CRD's default: gateway.networking.k8s.io
    kind: str


class AllowedRoutes(K8sModel):
    namespaces: RouteNamespaces = Field(default_factory=RouteNamespaces)
    kinds: tuple[RouteGroupKind, ...] = ()


class Listener(K8sModel):
    name: str
    port: int = Field(ge=1, le=65535)
    protocol: str
    hostname: str | None = None
    tls: GatewayTLSConfig | None = None
    allowed_routes: AllowedRoutes = Field(default_factory=AllowedRoutes)


class GatewayAddress(K8sModel):
    type: str | None = None
    value: str = ""


class GatewaySpec(K8sModel):
    gateway_class_name: str
    listeners: tuple[Listener, ...] = ()
    addresses: tuple[GatewayAddress, ...] = ()


class Gateway(K8sObject):
    spec: GatewaySpec


class ParentReference(K8sModel):
    group: str | None = None
    kind: str | None = None
    namespace: str | None = None
    name: str
    section_name: str | None = None
    port: int | None = None


class BackendRef(K8sModel):
    group: str | None = None
    kind: str | None = None
    name: str
    namespace: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    end_port: int | None = Field(default=None, ge=1, le=65535)
    weight: int | None = None


class RouteRule(K8sModel):
    backend_refs: tuple[BackendRef, ...] = ()


class RouteSpec(K8sModel):
    parent_refs: tuple[ParentReference, ...] = ()
    rules: tuple[RouteRule, ...] = ()


class UDPRouteV1A2(K8sObject):
    """``gateway.networking.k8s.io/v1alpha2`` UDPRoute; a backend's ``port`` is not used."""

    spec: RouteSpec = Field(default_factory=RouteSpec)


class ReferenceGrantFrom(K8sModel):
    group: str = ""
    kind: str
    namespace: str


class ReferenceGrantTo(K8sModel):
    group: str = ""
    kind: str
    name: str | None = None


class ReferenceGrantSpec(K8sModel):
    from_: tuple[ReferenceGrantFrom, ...] = Field(default=(), alias="from")
    to: tuple[ReferenceGrantTo, ...] = ()


class ReferenceGrant(K8sObject):
    """Lets objects of the ``from`` kinds and namespaces reference the ``to`` objects of the
    grant's own namespace (Gateway API v1beta1/v1)."""

    spec: ReferenceGrantSpec = Field(default_factory=ReferenceGrantSpec)
