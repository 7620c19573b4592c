"""Core Kubernetes objects the operator reads: Service, EndpointSlice, Secret, Node, Namespace.

These are the cluster's facts the renderer turns into cluster endpoints, TLS material, auth
credentials and public addresses. Secrets accept both ``data`` (base64) and ``stringData`` (plain
text), as ``kubectl apply`` does, so a folder of manifests works unchanged.
"""

from __future__ import annotations

import base64
import binascii

from pydantic import Field, field_validator

from stunner_common.crds._base import K8sModel, K8sObject, StrMap


class ServicePort(K8sModel):
    name: str = ""
    protocol: str = "TCP"
    port: int = 0
    target_port: int | str | None = None
    node_port: int | None = None


class ServiceSpec(K8sModel):
    type: str = "ClusterIP"
    cluster_ip: str = Field(default="", alias="clusterIP")
    cluster_ips: tuple[str, ...] = Field(default=(), alias="clusterIPs")
    selector: dict[str, str] = Field(default_factory=dict)
    ports: tuple[ServicePort, ...] = ()


class PortStatus(K8sModel):
    port: int = 0
    protocol: str = ""
    error: str | None = None


class LoadBalancerIngress(K8sModel):
    ip: str = ""
    hostname: str = ""
    ports: tuple[PortStatus, ...] = ()


class LoadBalancerStatus(K8sModel):
    ingress: tuple[LoadBalancerIngress, ...] = ()


class ServiceStatus(K8sModel):
    load_balancer: LoadBalancerStatus = Field(default_factory=LoadBalancerStatus)


class Service(K8sObject):
    spec: ServiceSpec = Field(default_factory=ServiceSpec)
    status: ServiceStatus = Field(default_factory=ServiceStatus)


class EndpointConditions(K8sModel):
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None


class Endpoint(K8sModel):
    addresses: tuple[str, ...] = ()
    conditions: EndpointConditions = Field(default_factory=EndpointConditions)


class EndpointSlice(K8sObject):
    address_type: str = "IPv4"
    endpoints: tuple[Endpoint, ...] = ()

    @property
    def service_name(self) -> str:
        return self.metadata.labels.get("kubernetes.io/service-name", "")


class Secret(K8sObject):
    type: str = "Opaque"
    data: dict[str, str] = Field(default_factory=dict)
    string_data: StrMap = Field(default_factory=dict)

    @field_validator("data")
    @classmethod
    def _data_is_base64(cls, value: dict[str, str]) -> dict[str, str]:
        for key, encoded in value.items():
            try:
                base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"data.{key} is not valid base64") from None
        return value

    def values(self) -> dict[str, bytes]:
        """The decoded contents: ``data`` merged with ``stringData`` (which wins, as in the API)."""
        out = {key: base64.b64decode(encoded) for key, encoded in self.data.items()}
        out.update({key: text.encode() for key, text in self.string_data.items()})
        return out

    def text(self, key: str) -> str | None:
        raw = self.values().get(key)
        return None if raw is None else raw.decode("utf-8", errors="replace")


class NodeAddress(K8sModel):
    type: str = ""
    address: str = ""


class NodeStatus(K8sModel):
    addresses: tuple[NodeAddress, ...] = ()


class Node(K8sObject):
    status: NodeStatus = Field(default_factory=NodeStatus)


class Namespace(K8sObject):
    pass
