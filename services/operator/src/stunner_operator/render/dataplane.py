"""The per-Gateway stunnerd Deployment (or DaemonSet), as a manifest (Dataplane in https://github.com/l7mp/stunner/blob/main/docs/GATEWAY.md).

The renderer only computes what the workload should look like: the cluster controller applies
it, merging with fields owned by others. The Dataplane is its template; the Gateway's merged
annotations (``annotations``) propagate to it, the pods get only the Dataplane's.
"""

from __future__ import annotations

from typing import Any

from stunner_common.contracts.listener_address import POD_ADDRESS_ENV
from stunner_common.contracts.listener_port import TargetPorts
from stunner_common.crds import Dataplane, Gateway, Node
from stunner_operator.render.annotations import (
    APP_LABEL,
    APP_VALUE,
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
    owner_reference,
)
from stunner_operator.render.families import dual_stack_env, ip_families
from stunner_operator.render.handoff import (
    HANDOFF_MIN_READY_S,
    add_handoff,
    handoff_enabled,
    handoff_env,
    handoff_problems,
)
from stunner_operator.render.options import RenderOptions, cds_server_uri

WORKLOAD_KINDS = ("Deployment", "DaemonSet")

CONTAINER_NAME = "stunner-daemon"
DEFAULT_TERMINATION_GRACE_S = 30  # GATEWAY.md, Dataplane terminationGracePeriodSeconds
HEALTH_PORT = 8086
# Where the Dataplane is silent, upstream's renderer runs `stunnerd -w --udp-thread-num=16`
# (https://github.com/l7mp/stunner-gateway-operator, internal/renderer/dataplane_util.go): `-w`
# makes stunnerd follow the CDS, without it every edit after the first config is lost. Upstream's
# 16 are goroutines reading one port; here each is a Python process of its own, so a Dataplane
# that gives no resources gets one (docs/upstream-differences.md, `dataplane-default-args`).
DEFAULT_COMMAND = ("stunnerd",)
DEFAULT_ARGS = ("-w",)
METRICS_PORT = 8080


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
    problems = handoff_problems(dataplane, workload_kind(dataplane))
    if kind and kind not in WORKLOAD_KINDS:
        problems.insert(
            0,
            f"Dataplane {dataplane.metadata.name}: dataplaneResource {kind!r} is not "
            "Deployment or DaemonSet; rendering a Deployment",
        )
    return problems


def container_ports(gw: Gateway, targetports: TargetPorts) -> list[dict[str, Any]]:
    """The listeners' ports, for a pod on the host network (where they are the host's ports).

    The ``targetport`` annotation moves a listener, as it does in the config. Unnamed: listener
    names rarely fit a port name's 15 characters.
    """
    seen: set[tuple[int, str]] = set()
    out: list[dict[str, Any]] = []
    for ls in gw.spec.listeners:
        proto = "UDP" if ls.protocol.upper().removeprefix("TURN-") in ("UDP", "DTLS") else "TCP"
        port = targetports.bound_port(ls.name, ls.port)
        if (port, proto) in seen or not 1 <= port <= 65535:
            continue
        seen.add((port, proto))
        out.append({"containerPort": port, "hostPort": port, "protocol": proto})
    return out


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
    gw: Gateway,
    dataplane: Dataplane,
    annotations: dict[str, str],
    options: RenderOptions,
    targetports: TargetPorts,
) -> dict[str, Any]:
    """The desired stunnerd Deployment of ``gw`` from the Dataplane template.

    ``annotations`` are the merged GatewayConfig and Gateway annotations: GATEWAY.md has both
    propagate to the Deployment (the pods get only the Dataplane's, to avoid restarts);
    ``targetports`` is their targetport annotation, decoded once per render.
    """
    ns, name = gw.metadata.namespace, gw.metadata.name
    dp = dataplane.spec
    kind = workload_kind(dataplane)
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
    container = _container(gw, dataplane, kind, annotations, options, targetports)
    pod_spec = _pod_spec(dataplane, container)
    if handoff_enabled(dataplane, kind):
        add_handoff(pod_spec, dataplane)
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
    deployment["spec"].update(_rollout(kind, dataplane))
    return deployment


def _rollout(kind: str, dataplane: Dataplane) -> dict[str, Any]:
    """A DaemonSet's update strategy, or a Deployment's replicas (when the Dataplane sets them)."""
    dp = dataplane.spec
    if kind == "DaemonSet":
        # A new pod starts before the old one stops (maxSurge, DaemonSets since Kubernetes
        # 1.25), so a node keeps a ready stunnerd through a rollout. On the host network two
        # pods cannot hold one host port: the old pod goes first there, unless the new one
        # takes the old one's sockets over (handoff; its pods declare no host ports).
        rolling = (
            {"maxSurge": 0, "maxUnavailable": 1}
            if dp.host_network and not handoff_enabled(dataplane, kind)
            else {"maxSurge": 1, "maxUnavailable": 0}
        )
        rollout: dict[str, Any] = {
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": rolling}
        }
        if handoff_enabled(dataplane, kind):
            rollout["minReadySeconds"] = HANDOFF_MIN_READY_S
        return rollout
    return {"replicas": dp.replicas} if dp.replicas is not None else {}


def _container(
    gw: Gateway,
    dataplane: Dataplane,
    kind: str,
    annotations: dict[str, str],
    options: RenderOptions,
    targetports: TargetPorts,
) -> dict[str, Any]:
    """The stunnerd container: image, environment, ports, probes, security context."""
    ns, name = gw.metadata.namespace, gw.metadata.name
    dp = dataplane.spec
    image = dp.image or options.default_image
    env: list[dict[str, Any]] = [
        {"name": POD_ADDRESS_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "STUNNER_NAME", "value": name},
        {"name": "STUNNER_NAMESPACE", "value": ns},
        {"name": "STUNNER_NODENAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "STUNNER_CONFIG_ORIGIN", "value": cds_server_uri(options.cds_address)},
        *cds_token_env(dataplane, options),
        *quota_env(dataplane, kind, options),
        *(dual_stack_env() if ip_families(gw, annotations).dual_stack else ()),
        *(handoff_env(ns, name) if handoff_enabled(dataplane, kind) else ()),
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
    container["command"] = list(dp.command or DEFAULT_COMMAND)
    container["args"] = list(dp.args or DEFAULT_ARGS)
    container["env"] = env
    if dp.env_from:
        container["envFrom"] = [dict(e) for e in dp.env_from]
    if dp.resources is not None:  # GATEWAY.md: "Default: none"
        container["resources"] = dp.resources
    container["ports"] = [{"name": "metrics-port", "containerPort": METRICS_PORT}]
    if dp.host_network:
        container["ports"] += container_ports(gw, targetports)
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
    return container


def _pod_spec(dataplane: Dataplane, container: dict[str, Any]) -> dict[str, Any]:
    """The pod around ``container``: grace period, host network, scheduling, pull secrets."""
    dp = dataplane.spec
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
    return pod_spec
