"""STUNner's CRDs (``stunner.l7mp.io``): GatewayConfig, Dataplane, StaticService, UDPRoute.

Both served versions (v1 and v1alpha1) parse into the same models; the v1alpha1-only fields are
kept as extra fields and ignored. Defaults are those of the CRD schemas, so an object from a file
renders the same as the one the API server would have stored.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from stunner_common.crds._base import K8sModel, K8sObject, StrMap
from stunner_common.crds.gateway_api import RouteSpec, SecretObjectReference

STUNNER_GROUP = "stunner.l7mp.io"


class GatewayConfigSpec(K8sModel):
    dataplane: str = "default"
    realm: str = "stunner.l7mp.io"
    auth_type: str = "plaintext"
    user_name: str | None = None
    password: str | None = None
    shared_secret: str | None = None
    auth_lifetime: int | None = None
    auth_ref: SecretObjectReference | None = None
    load_balancer_service_annotations: StrMap = Field(default_factory=dict)
    log_level: str | None = None
    user_quota: int | None = None
    stun_mode: bool = False
    """A STUN-only server: auth type ``none``, every TURN request refused (upstream premium)."""


class GatewayConfig(K8sObject):
    spec: GatewayConfigSpec = Field(default_factory=GatewayConfigSpec)


class DataplaneSpec(K8sModel):
    image: str = ""
    image_pull_policy: str | None = None
    image_pull_secrets: tuple[dict[str, Any], ...] = ()
    dataplane_resource: str = "Deployment"
    labels: StrMap = Field(default_factory=dict)
    annotations: StrMap = Field(default_factory=dict)
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    env_from: tuple[dict[str, Any], ...] = ()
    container_security_context: dict[str, Any] | None = None
    replicas: int | None = None
    resources: dict[str, Any] | None = None
    termination_grace_period_seconds: int | None = None
    host_network: bool = False
    affinity: dict[str, Any] | None = None
    security_context: dict[str, Any] | None = None
    tolerations: tuple[dict[str, Any], ...] | None = None
    topology_spread_constraints: tuple[dict[str, Any], ...] | None = None
    disable_health_check: bool = False
    enable_metrics_endpoint: bool = False
    offload_engine: str = "None"
    offload_interfaces: tuple[str, ...] = ()
    handoff: bool = False
    """Hot handoff between a node's old and new stunnerd pod (ours; DaemonSet, host network)."""


class Dataplane(K8sObject):
    spec: DataplaneSpec = Field(default_factory=DataplaneSpec)


class StaticServiceSpec(K8sModel):
    prefixes: tuple[str, ...] = ()


class StaticService(K8sObject):
    spec: StaticServiceSpec = Field(default_factory=StaticServiceSpec)


class UDPRoute(K8sObject):
    """``stunner.l7mp.io/v1`` UDPRoute: backends may carry a ``port``/``endPort`` range."""

    spec: RouteSpec = Field(default_factory=RouteSpec)
