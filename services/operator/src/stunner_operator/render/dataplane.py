"""The per-Gateway LoadBalancer Service and stunnerd Deployment (or DaemonSet), as manifests.

The renderer only computes what these objects should look like (reference §10 and §13): the
cluster controller applies them, merging with fields owned by others. Every
``stunner.l7mp.io/*`` annotation of GATEWAY.md is interpreted here, read from the GatewayConfig's
``loadBalancerServiceAnnotations`` overridden by the Gateway's own annotations.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from stunner_common.crds import Dataplane, Gateway, GatewayConfig, Listener, Node, Service
from stunner_operator.render.families import (
    address_family,
    dual_stack_env,
    hinted_ips,
    ip_families,
    ip_family_problems,
)
from stunner_operator.render.options import RenderOptions, cds_server_uri

OWNED_BY_LABEL = "stunner.l7mp.io/owned-by"
OWNED_BY_VALUE = "stunner"
RELATED_GATEWAY_NAME = "stunner.l7mp.io/related-gateway-name"
RELATED_GATEWAY_NAMESPACE = "stunner.l7mp.io/related-gateway-namespace"
APP_LABEL = "app"
APP_VALUE = "stunner"

SERVICE_TYPE = "stunner.l7mp.io/service-type"
MIXED_PROTOCOL = "stunner.l7mp.io/enable-mixed-protocol-lb"
EXTERNAL_TRAFFIC_POLICY = "stunner.l7mp.io/external-traffic-policy"
DISABLE_MANAGED_DATAPLANE = "stunner.l7mp.io/disable-managed-dataplane"
NODEPORT = "stunner.l7mp.io/nodeport"
TARGETPORT = "stunner.l7mp.io/targetport"
DISABLE_HEALTH_CHECK_EXPOSE = "stunner.l7mp.io/disable-health-check-expose"
DISABLE_SESSION_AFFINITY = "stunner.l7mp.io/disable-session-affinity"
RELAY_ADDRESS_DISCOVERY = "stunner.l7mp.io/enable-relay-address-discovery"
NODE_ADDRESS_PLACEHOLDER = "__node_address_placeholder"
"""A listener address the CDS replaces with the stunnerd pod's Node's external address."""

WORKLOAD_KINDS = ("Deployment", "DaemonSet")

SERVICE_TYPES = ("ClusterIP", "NodePort", "ExternalName", "LoadBalancer")
HEALTH_CHECK_PORT_NAME = "gateway-health-check"
_HEALTH_PORT_RE = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*port$")
_HEALTH_PROTO_RE = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*protocol$")

CONTAINER_NAME = "stunner-daemon"
DEFAULT_TERMINATION_GRACE_S = 30  # GATEWAY.md, Dataplane terminationGracePeriodSeconds
HEALTH_PORT = 8086
METRICS_PORT = 8080


@dataclass(frozen=True, slots=True)
class ExposedListener:
    """A listener the Service may expose: its spec and its Service protocol (UDP or TCP)."""

    listener: Listener
    service_protocol: str


def is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


def merged_annotations(gw: Gateway, gwconfig: GatewayConfig) -> dict[str, str]:
    """GatewayConfig LB annotations overridden by the Gateway's annotations."""
    out = dict(gwconfig.spec.load_balancer_service_annotations)
    out.update(gw.metadata.annotations)
    return out


def parse_port_map(annotations: dict[str, str], key: str) -> tuple[dict[str, int], list[str]]:
    """The JSON ``{"listener": port}`` map of a nodeport/targetport annotation, and its problems.

    GATEWAY.md's examples leave the braces out (``"udp-listener": 30000``), so a bare list of
    pairs is read as if braced. Entries that are not a port (an integer in 1-65535) are dropped
    and named in the problems, as is an annotation that is not such a map at all.
    """
    raw = annotations.get(key)
    if raw is None:
        return {}, []
    data: Any = None
    for text in (raw, "{" + raw + "}"):
        try:
            data = json.loads(text)
            break
        except json.JSONDecodeError:
            continue
    if not isinstance(data, dict):
        return {}, [f"annotation {key}: {raw!r} is not a JSON map of listener name to port"]
    out: dict[str, int] = {}
    problems: list[str] = []
    for name, port in data.items():
        if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
            out[str(name)] = port
        else:
            problems.append(
                f"annotation {key}: port {port!r} of listener {name!r} is not in 1-65535"
            )
    return out, problems


def port_map(annotations: dict[str, str], key: str) -> dict[str, int]:
    """The valid entries of a nodeport/targetport annotation (see ``parse_port_map``)."""
    return parse_port_map(annotations, key)[0]


_BOOLEAN_ANNOTATIONS = (
    MIXED_PROTOCOL,
    DISABLE_MANAGED_DATAPLANE,
    DISABLE_HEALTH_CHECK_EXPOSE,
    DISABLE_SESSION_AFFINITY,
    RELAY_ADDRESS_DISCOVERY,
)


def node_addresses(nodes: list[Node]) -> dict[str, str]:
    """Each Node's external address for relay address discovery: its first ExternalIP, else
    its first ExternalDNS name (the CDS resolves names).

    Nodes with neither are left out (the CDS then falls back to the pod's own address).
    """
    out: dict[str, str] = {}
    for node in nodes:
        for wanted in ("ExternalIP", "ExternalDNS"):
            found = next(
                (a.address for a in node.status.addresses if a.type == wanted and a.address),
                None,
            )
            if found is not None:
                out[node.metadata.name] = found
                break
    return out


def workload_kind(dataplane: Dataplane) -> str:
    """``Deployment`` or ``DaemonSet`` (``dataplaneResource``); anything else: Deployment."""
    kind = dataplane.spec.dataplane_resource or "Deployment"
    return kind if kind in WORKLOAD_KINDS else "Deployment"


def dataplane_problems(dataplane: Dataplane) -> list[str]:
    kind = dataplane.spec.dataplane_resource
    if kind and kind not in WORKLOAD_KINDS:
        return [
            f"Dataplane {dataplane.metadata.name}: dataplaneResource {kind!r} is not "
            "Deployment or DaemonSet; rendering a Deployment"
        ]
    return []


def container_ports(gw: Gateway, annotations: dict[str, str]) -> list[dict[str, Any]]:
    """The listeners' ports, for a pod on the host network (where they are the host's ports).

    The ``targetport`` annotation moves a listener, as it does in the config. Unnamed: listener
    names rarely fit a port name's 15 characters.
    """
    targetports = port_map(annotations, TARGETPORT)
    seen: set[tuple[int, str]] = set()
    out: list[dict[str, Any]] = []
    for ls in gw.spec.listeners:
        proto = "UDP" if ls.protocol.upper().removeprefix("TURN-") in ("UDP", "DTLS") else "TCP"
        port = targetports.get(ls.name, ls.port)
        if (port, proto) in seen or not 1 <= port <= 65535:
            continue
        seen.add((port, proto))
        out.append({"containerPort": port, "hostPort": port, "protocol": proto})
    return out


def annotation_problems(annotations: dict[str, str], listener_names: list[str]) -> list[str]:
    """What is wrong with the ``stunner.l7mp.io/*`` annotations: each is ignored, not fatal."""
    problems: list[str] = []
    kind = annotations.get(SERVICE_TYPE)
    if kind is not None and kind not in SERVICE_TYPES:
        problems.append(
            f"annotation {SERVICE_TYPE}: {kind!r} is not one of {', '.join(SERVICE_TYPES)}; "
            "using LoadBalancer"
        )
    for key in (NODEPORT, TARGETPORT):
        ports, bad = parse_port_map(annotations, key)
        problems.extend(bad)
        problems.extend(
            f"annotation {key}: the Gateway has no listener {name!r}"
            for name in ports
            if name not in listener_names
        )
    for key in _BOOLEAN_ANNOTATIONS:
        value = annotations.get(key)
        if value is not None and value.strip().lower() not in ("true", "false"):
            problems.append(f"annotation {key}: {value!r} is not true or false; read as false")
    policy = annotations.get(EXTERNAL_TRAFFIC_POLICY)
    if policy is not None and policy.strip().lower() not in ("local", "cluster"):
        problems.append(
            f"annotation {EXTERNAL_TRAFFIC_POLICY}: {policy!r} is not Local or Cluster; ignored"
        )
    problems.extend(ip_family_problems(annotations))
    return problems


def service_type(annotations: dict[str, str]) -> str:
    value = annotations.get(SERVICE_TYPE, "")
    return value if value in SERVICE_TYPES else "LoadBalancer"


def exposed_listeners(
    candidates: list[ExposedListener], annotations: dict[str, str]
) -> list[ExposedListener]:
    """Without the mixed-protocol annotation only the first valid listener's protocol is exposed."""
    if not candidates or is_true(annotations.get(MIXED_PROTOCOL)):
        return list(candidates)
    proto = candidates[0].service_protocol
    return [c for c in candidates if c.service_protocol == proto]


def _health_check_port(annotations: dict[str, str]) -> int | None:
    if is_true(annotations.get(DISABLE_HEALTH_CHECK_EXPOSE)):
        return None
    port = next((v for k, v in sorted(annotations.items()) if _HEALTH_PORT_RE.match(k)), None)
    proto = next((v for k, v in sorted(annotations.items()) if _HEALTH_PROTO_RE.match(k)), None)
    if port is None or proto is None or proto.strip().upper() not in ("TCP", "HTTP"):
        return None
    try:
        value = int(port)
    except ValueError:
        return None
    return value if 1 <= value <= 65535 else None


def owner_reference(gw: Gateway) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "name": gw.metadata.name,
    }
    if gw.metadata.uid:
        ref["uid"] = gw.metadata.uid
    return ref


def render_service(
    gw: Gateway,
    exposed: list[ExposedListener],
    annotations: dict[str, str],
    existing: Service | None,
) -> dict[str, Any] | None:
    """The desired LB Service of ``gw``, or None when no listener can be exposed."""
    if not exposed:
        return None
    ns, name = gw.metadata.namespace, gw.metadata.name
    svc_type = service_type(annotations)
    nodeports = port_map(annotations, NODEPORT)
    targetports = port_map(annotations, TARGETPORT)
    old_ports = {p.name: p for p in existing.spec.ports} if existing is not None else {}
    ports: list[dict[str, Any]] = []
    for item in exposed:
        ls = item.listener
        port: dict[str, Any] = {"name": ls.name, "protocol": item.service_protocol, "port": ls.port}
        old = old_ports.get(ls.name)
        if ls.name in targetports:
            port["targetPort"] = targetports[ls.name]
        elif old is not None and old.target_port is not None:
            port["targetPort"] = old.target_port
        if ls.name in nodeports:
            port["nodePort"] = nodeports[ls.name]
        elif old is not None and old.node_port:
            port["nodePort"] = old.node_port
        ports.append(port)
    if svc_type == "LoadBalancer" and (hc := _health_check_port(annotations)) is not None:
        ports.append({"name": HEALTH_CHECK_PORT_NAME, "protocol": "TCP", "port": hc})
    spec: dict[str, Any] = {
        "type": svc_type,
        "selector": {
            APP_LABEL: APP_VALUE,
            RELATED_GATEWAY_NAME: name,
            RELATED_GATEWAY_NAMESPACE: ns,
        },
        "ports": ports,
    }
    if not is_true(annotations.get(DISABLE_SESSION_AFFINITY)):
        spec["sessionAffinity"] = "ClientIP"  # disabled: Kubernetes' default, None
    if annotations.get(EXTERNAL_TRAFFIC_POLICY, "").strip().lower() == "local" and svc_type in (
        "NodePort",
        "LoadBalancer",
    ):
        spec["externalTrafficPolicy"] = "Local"
    if gw.spec.addresses:
        addr = gw.spec.addresses[0]
        if (addr.type or "IPAddress") == "IPAddress" and addr.value:
            spec["loadBalancerIP"] = addr.value
            spec["externalIPs"] = [addr.value]
    families = ip_families(gw, annotations)
    if families.policy is not None:
        spec["ipFamilyPolicy"] = families.policy
    if families.families:
        spec["ipFamilies"] = list(families.families)
    if families.dual_stack and "externalIPs" in spec:
        # the first hinted address of the other family too (GATEWAY.md uses only the first)
        other = next(
            (
                ip
                for ip in hinted_ips(gw)
                if address_family(ip) != address_family(spec["externalIPs"][0])
            ),
            None,
        )
        if other is not None:
            spec["externalIPs"].append(other)
    svc_annotations = dict(annotations)
    svc_annotations[RELATED_GATEWAY_NAME] = f"{ns}/{name}"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {
                OWNED_BY_LABEL: OWNED_BY_VALUE,
                RELATED_GATEWAY_NAME: name,
                RELATED_GATEWAY_NAMESPACE: ns,
            },
            "annotations": dict(sorted(svc_annotations.items())),
            "ownerReferences": [owner_reference(gw)],
        },
        "spec": spec,
    }


def default_pull_policy(image: str) -> str:
    """GATEWAY.md: ``Always`` for the ``latest`` tag, ``IfNotPresent`` otherwise.

    An image without tag or digest is the registry's ``latest``, as the container runtime pulls
    it, so it counts as ``latest`` too.
    """
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


OFFLOAD_CAPABILITIES = ("BPF", "NET_ADMIN")


def _with_capabilities(context: dict[str, Any] | None, caps: tuple[str, ...]) -> dict[str, Any]:
    """A copy of a container securityContext that also adds `caps` (kept sorted, no repeats)."""
    out = dict(context or {})
    capabilities = dict(out.get("capabilities") or {})
    capabilities["add"] = sorted({*capabilities.get("add", ()), *caps})
    out["capabilities"] = capabilities
    return out


CDS_TOKEN_ENV = ("CDS_TOKEN", "CDS_TOKEN_FILE")


def cds_token_env(dataplane: Dataplane, options: RenderOptions) -> list[dict[str, Any]]:
    """``CDS_TOKEN`` from the configured Secret, unless the Dataplane gives a token itself.

    The reference is not optional: a pod whose namespace lacks the Secret does not start, and
    its events name the Secret, rather than watching the CDS without a token and being refused.
    """
    if not options.cds_token_secret or any(
        e.get("name") in CDS_TOKEN_ENV for e in dataplane.spec.env
    ):
        return []
    ref = {"name": options.cds_token_secret, "key": options.cds_token_key}
    return [{"name": "CDS_TOKEN", "valueFrom": {"secretKeyRef": ref}}]


def quota_env(dataplane: Dataplane, kind: str, options: RenderOptions) -> list[dict[str, Any]]:
    """Where the pods count ``userQuota`` across replicas, and how many share it.

    The replica count of a Deployment sets each pod's share while Redis is unreachable; a
    DaemonSet's pod count follows the nodes, so its pods fall back to the whole quota each.
    """
    if not options.quota_redis_secret or any(
        e.get("name") == "STUNNERD_QUOTA_REDIS_URL" for e in dataplane.spec.env
    ):
        return []
    ref = {"name": options.quota_redis_secret, "key": options.quota_redis_key}
    env: list[dict[str, Any]] = [
        {"name": "STUNNERD_QUOTA_REDIS_URL", "valueFrom": {"secretKeyRef": ref}}
    ]
    if kind == "Deployment" and dataplane.spec.replicas is not None:
        env.append(
            {"name": "STUNNERD_QUOTA_REPLICAS", "value": str(max(1, dataplane.spec.replicas))}
        )
    return env


def render_deployment(
    gw: Gateway, dataplane: Dataplane, annotations: dict[str, str], options: RenderOptions
) -> dict[str, Any]:
    """The desired stunnerd Deployment of ``gw`` from the Dataplane template (reference §13).

    ``annotations`` are the merged GatewayConfig and Gateway annotations: GATEWAY.md has both
    propagate to the Deployment (the pods get only the Dataplane's, to avoid restarts).
    """
    ns, name = gw.metadata.namespace, gw.metadata.name
    dp = dataplane.spec
    kind = workload_kind(dataplane)
    image = dp.image or options.default_image
    labels = {k: v for k, v in gw.metadata.labels.items() if k not in options.label_filter}
    labels.update(
        {OWNED_BY_LABEL: OWNED_BY_VALUE, RELATED_GATEWAY_NAME: name, RELATED_GATEWAY_NAMESPACE: ns}
    )
    annotations = dict(annotations)
    annotations[RELATED_GATEWAY_NAME] = f"{ns}/{name}"
    pod_labels = dict(dp.labels)
    pod_labels.update(
        {APP_LABEL: APP_VALUE, RELATED_GATEWAY_NAME: name, RELATED_GATEWAY_NAMESPACE: ns}
    )
    pod_annotations = dict(dp.annotations)
    pod_annotations[RELATED_GATEWAY_NAME] = f"{ns}/{name}"
    env: list[dict[str, Any]] = [
        {"name": "STUNNER_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "STUNNER_NAME", "value": name},
        {"name": "STUNNER_NAMESPACE", "value": ns},
        {"name": "STUNNER_NODENAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "STUNNER_CONFIG_ORIGIN", "value": cds_server_uri(options.cds_address)},
        *cds_token_env(dataplane, options),
        *quota_env(dataplane, kind, options),
        *(dual_stack_env() if ip_families(gw, annotations).dual_stack else ()),
        *(dict(e) for e in dp.env),
    ]
    # With an offload engine stunnerd loads BPF and attaches it to the pod's interfaces; only
    # then does the pod get those capabilities.
    offload = (dp.offload_engine or "None") != "None"
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": dp.image_pull_policy or default_pull_policy(image),
    }
    # GATEWAY.md gives no default command or args: the image's entrypoint runs unless set.
    if dp.command:
        container["command"] = list(dp.command)
    if dp.args:
        container["args"] = list(dp.args)
    container["env"] = env
    if dp.env_from:
        container["envFrom"] = [dict(e) for e in dp.env_from]
    if dp.resources is not None:  # GATEWAY.md: "Default: none"
        container["resources"] = dp.resources
    container["ports"] = [{"name": "metrics-port", "containerPort": METRICS_PORT}]
    if dp.host_network:
        container["ports"] += container_ports(gw, annotations)
    if not dp.disable_health_check:
        for probe, path in (("livenessProbe", "/live"), ("readinessProbe", "/ready")):
            container[probe] = {
                "httpGet": {"path": path, "port": HEALTH_PORT},
                "periodSeconds": 15,
            }
    if dp.container_security_context is not None:
        container["securityContext"] = dp.container_security_context
    if offload:
        container["securityContext"] = _with_capabilities(
            container.get("securityContext"), OFFLOAD_CAPABILITIES
        )
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": dp.termination_grace_period_seconds
        if dp.termination_grace_period_seconds is not None
        else DEFAULT_TERMINATION_GRACE_S,
    }
    if dp.host_network:
        # The pod IP is the node's: listeners and relays use the node's address. Cluster DNS
        # (the CDS Service name) needs ClusterFirstWithHostNet on the host network.
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    for key, value in (
        ("affinity", dp.affinity),
        ("tolerations", dp.tolerations),
        ("securityContext", dp.security_context),
        ("imagePullSecrets", dp.image_pull_secrets or None),
        ("topologySpreadConstraints", dp.topology_spread_constraints),
    ):
        if value is not None:
            pod_spec[key] = list(value) if isinstance(value, tuple) else value
    selector_labels = {
        APP_LABEL: APP_VALUE,
        RELATED_GATEWAY_NAME: name,
        RELATED_GATEWAY_NAMESPACE: ns,
    }
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": dict(sorted(labels.items())),
            "annotations": dict(sorted(annotations.items())),
            "ownerReferences": [owner_reference(gw)],
        },
        "spec": {
            "selector": {
                "matchExpressions": [
                    {"key": k, "operator": "In", "values": [v]} for k, v in selector_labels.items()
                ]
            },
            "template": {
                "metadata": {
                    "labels": dict(sorted(pod_labels.items())),
                    "annotations": dict(sorted(pod_annotations.items())),
                },
                "spec": pod_spec,
            },
        },
    }
    if kind == "DaemonSet":
        # A new pod starts before the old one stops (maxSurge, DaemonSets since Kubernetes
        # 1.25), so a node keeps a ready stunnerd through a rollout. On the host network two
        # pods cannot hold one host port: the old pod goes first there.
        rolling = (
            {"maxSurge": 0, "maxUnavailable": 1}
            if dp.host_network
            else {"maxSurge": 1, "maxUnavailable": 0}
        )
        deployment["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": rolling}
    elif dp.replicas is not None:
        deployment["spec"]["replicas"] = dp.replicas
    return deployment
