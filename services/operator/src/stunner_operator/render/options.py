"""Knobs of the renderer that come from the operator's settings, not from the objects."""

from __future__ import annotations

from dataclasses import dataclass

from stunner_operator.render.status import CONTROLLER_NAME

DEFAULT_LABEL_FILTER: tuple[str, ...] = (
    "applyset.kubernetes.io/part-of",
    "applyset.k8s.io/part-of",
    "app.kubernetes.io/managed-by",
    "argocd.argoproj.io/instance",
    "kustomize.toolkit.fluxcd.io/name",
    "kustomize.toolkit.fluxcd.io/namespace",
)

DEFAULT_CDS_ADDRESS = "stunner-config-discovery:13478"
CDS_PORT = 13478


@dataclass(frozen=True, slots=True)
class RenderOptions:
    controller_name: str = CONTROLLER_NAME
    endpoint_discovery: bool = True
    """Use EndpointSlice addresses (STATIC clusters); off gives STRICT_DNS service names."""
    relay_to_cluster_ip: bool = True
    """Also admit a backend Service's ClusterIP."""
    cds_address: str = DEFAULT_CDS_ADDRESS
    """Where dataplane pods find the CDS (``host[:port]``), put in ``STUNNER_CONFIG_ORIGIN``."""
    cds_token_secret: str = ""
    """A Secret (in each Gateway's namespace) whose ``cds_token_key`` the dataplane pods get as
    ``CDS_TOKEN``, the bearer token of the CDS; empty: no token is given to them."""
    cds_token_key: str = "token"
    label_filter: tuple[str, ...] = DEFAULT_LABEL_FILTER
    """Gateway labels that are not copied onto the Deployment."""
    quota_redis_secret: str = ""
    """A Secret (in each Gateway's namespace) whose ``quota_redis_key`` is the Redis URL the
    stunnerd pods count ``userQuota`` in across replicas (``STUNNERD_QUOTA_REDIS_URL``); empty:
    each pod counts its own allocations."""
    quota_redis_key: str = "url"
    default_image: str = "l7mp/stunnerd:latest"
    enforce_reference_grants: bool = False
    """Cross-namespace backendRefs and certificateRefs need a ReferenceGrant (``grants.py``);
    off, as upstream STUNner, they resolve without one."""


def parse_label_filter(text: str | None) -> tuple[str, ...]:
    """Upstream's ``STUNNER_GATEWAY_OPERATOR_LABEL_FILTER``: comma-separated label keys; unset
    keeps the default list, empty filters nothing."""
    if text is None:
        return DEFAULT_LABEL_FILTER
    return tuple(key.strip() for key in text.split(",") if key.strip())


def cds_server_uri(address: str) -> str:
    """``host[:port]`` (IPv6 bare or bracketed) to ``http://host:port``, default port 13478."""
    address = address.strip()
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif address.count(":") > 1:
        host, port = address, ""
    else:
        host, _, port = address.partition(":")
    port = port or str(CDS_PORT)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
