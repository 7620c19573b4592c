"""The Kubernetes resources the operator watches and writes, and their REST paths (what
``stunner_common.io.kube.api.KubeApi`` calls them by).

Each watched resource maps to a store kind of the renderer. Paths are built by hand rather than
through the generated clients so that core types, CRDs and Gateway API objects all travel as
plain JSON and are parsed by the same ``stunner_common.crds`` models as in local mode.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str  # the store kind (UDPRoute vs UDPRouteV1A2)
    group: str
    version: str
    plural: str
    namespaced: bool
    optional: bool = False  # skipped (with a log line) when the cluster does not serve it
    fallback: Resource | None = None  # an older version to watch when this one is not served

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def object_kind(self) -> str:
        """The kind of the resource's objects (both UDPRoute versions are ``UDPRoute``)."""
        return "UDPRoute" if self.kind == "UDPRouteV1A2" else self.kind

    def _base(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def list_path(self) -> str:
        """Every object of the resource, in all namespaces."""
        return f"{self._base()}/{self.plural}"

    def collection_path(self, namespace: str) -> str:
        if self.namespaced:
            return f"{self._base()}/namespaces/{namespace}/{self.plural}"
        return f"{self._base()}/{self.plural}"

    def object_path(self, namespace: str, name: str, subresource: str = "") -> str:
        path = f"{self.collection_path(namespace)}/{name}"
        return f"{path}/{subresource}" if subresource else path


WATCHED: tuple[Resource, ...] = (
    Resource("GatewayClass", "gateway.networking.k8s.io", "v1", "gatewayclasses", False),
    Resource("Gateway", "gateway.networking.k8s.io", "v1", "gateways", True),
    Resource("UDPRoute", "stunner.l7mp.io", "v1", "udproutes", True),
    # Gateway API's own UDPRoute: v1 since its v1.6 release (where v1alpha2 is no longer served
    # by the standard channel), v1alpha2 before. One store kind for both: their specs agree.
    Resource(
        "UDPRouteV1A2",
        "gateway.networking.k8s.io",
        "v1",
        "udproutes",
        True,
        True,
        fallback=Resource(
            "UDPRouteV1A2", "gateway.networking.k8s.io", "v1alpha2", "udproutes", True, True
        ),
    ),
    Resource("GatewayConfig", "stunner.l7mp.io", "v1", "gatewayconfigs", True),
    Resource("StaticService", "stunner.l7mp.io", "v1", "staticservices", True),
    Resource("Dataplane", "stunner.l7mp.io", "v1", "dataplanes", False),
    Resource("Service", "", "v1", "services", True),
    Resource("EndpointSlice", "discovery.k8s.io", "v1", "endpointslices", True),
    Resource("Secret", "", "v1", "secrets", True),
    Resource("Node", "", "v1", "nodes", False),
    Resource("Namespace", "", "v1", "namespaces", False),
)

# Read only where ReferenceGrants are enforced (the chart's RBAC may not let the operator list
# them otherwise).
REFERENCE_GRANTS = Resource(
    "ReferenceGrant",
    "gateway.networking.k8s.io",
    "v1",
    "referencegrants",
    True,
    fallback=Resource(
        "ReferenceGrant", "gateway.networking.k8s.io", "v1beta1", "referencegrants", True
    ),
)


def watched(*, enforce_reference_grants: bool) -> tuple[Resource, ...]:
    """What the controller watches: ``WATCHED``, plus ReferenceGrants when they are enforced."""
    return (*WATCHED, REFERENCE_GRANTS) if enforce_reference_grants else WATCHED


BY_KIND: dict[str, Resource] = {r.kind: r for r in (*WATCHED, REFERENCE_GRANTS)}
DEPLOYMENT = Resource("Deployment", "apps", "v1", "deployments", True)
DAEMONSET = Resource("DaemonSet", "apps", "v1", "daemonsets", True)
WRITABLE: dict[str, Resource] = {
    "Service": BY_KIND["Service"],
    "Deployment": DEPLOYMENT,
    "DaemonSet": DAEMONSET,
}


GATEWAY_API_INSTALL = (
    "install the Gateway API project's release (standard channel and the experimental UDPRoute:"
    " kubectl apply --server-side -f https://github.com/kubernetes-sigs/gateway-api/releases/"
    "download/v1.6.3/experimental-install.yaml)"
)


def missing_crd_message(res: Resource) -> str:
    """What to tell the user when the cluster does not serve a resource the operator needs."""
    crd = f"{res.plural}.{res.group}" if res.group else res.plural
    if res.group == "gateway.networking.k8s.io":
        hint = GATEWAY_API_INSTALL
    elif res.group == "stunner.l7mp.io":
        hint = "install the chart's CRDs (kubectl apply --server-side -f charts/stunner/crds/)"
    else:
        hint = "this Kubernetes version is too old for the operator"
    return f"the cluster does not serve {res.api_version} {res.plural} (CRD {crd}): {hint}"
