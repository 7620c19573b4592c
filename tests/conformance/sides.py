"""The two operators under comparison, each on its own fresh API server.

``UpstreamSide``: a ``KubeCluster`` with the official Gateway API release, upstream's CRDs (from
the operator module's ``config/crd/bases``) and upstream's stunner-gateway-operator v1.2.1 as a
local process (admin kubeconfig, its CDS on a free loopback port instead of 13478, metrics off,
health on a free port, no leader election). ``OursSide``: ``support.kube_stack.KubeStack`` (the
same Gateway API release, our chart, our operator as the chart's ServiceAccount, Redis, our CDS).

A case is applied, the side is polled until what it renders stops changing, and a ``Snapshot``
is taken: every stunnerd config its CDS serves, the status of every GatewayClass, Gateway and
UDPRoute of the case, and the Deployments and Services rendered for its Gateways. The case's
objects are then deleted and the side waits until its CDS serves nothing of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from support import gobin
from support.kube import KubeClient, KubeCluster, KubeError
from support.kube_stack import KubeStack, install_gateway_api
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, wait_for_tcp

SETTLE_QUIET_S = 2.5
SETTLE_TIMEOUT_S = 45.0
CLEAR_TIMEOUT_S = 15.0
POLL_S = 0.5

ROUTE_KINDS = (
    ("stunner.l7mp.io/v1", "UDPRoute"),
    ("gateway.networking.k8s.io/v1alpha2", "UDPRoute"),
)


@dataclass
class Snapshot:
    configs: dict[str, Any] = field(default_factory=dict)
    statuses: dict[str, Any] = field(default_factory=dict)
    services: dict[str, Any] = field(default_factory=dict)
    deployments: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "configs": self.configs,
            "statuses": self.statuses,
            "services": self.services,
            "deployments": self.deployments,
        }


def load_case(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _conditions(items: list[dict[str, Any]] | None) -> dict[str, list[str]]:
    """``{type: [status, reason]}`` (messages may differ)."""
    return {c.get("type", ""): [c.get("status", ""), c.get("reason", "")] for c in items or []}


def status_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is compared of a status: conditions as (type, status, reason), per listener and per
    parent too, and the Gateway's attached route counts and addresses."""
    status = obj.get("status") or {}
    kind = obj.get("kind")
    out: dict[str, Any] = {"conditions": _conditions(status.get("conditions"))}
    if kind == "Gateway":
        out["listeners"] = {
            item.get("name", ""): {
                "attachedRoutes": item.get("attachedRoutes"),
                "conditions": _conditions(item.get("conditions")),
            }
            for item in status.get("listeners") or []
        }
        out["addresses"] = sorted(
            f"{a.get('type', '')}:{a.get('value', '')}" for a in status.get("addresses") or []
        )
    if kind == "UDPRoute":
        out["parents"] = {
            f"{(p.get('parentRef') or {}).get('namespace', '')}/"
            f"{(p.get('parentRef') or {}).get('name', '')}"
            f":{(p.get('parentRef') or {}).get('sectionName', '')}": _conditions(
                p.get("conditions")
            )
            for p in status.get("parents") or []
        }
        del out["conditions"]
    return out


def requested_nodeports(docs: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """``{"ns/gateway": {listener: nodePort}}`` from the Gateways' nodeport annotations."""
    out = {}
    for doc in docs:
        if doc["kind"] != "Gateway":
            continue
        raw = ((doc["metadata"].get("annotations") or {}).get("stunner.l7mp.io/nodeport")) or "{}"
        with contextlib.suppress(ValueError):
            ns = doc["metadata"].get("namespace", "default")
            out[f"{ns}/{doc['metadata']['name']}"] = dict(json.loads(raw))
    return out


def service_view(
    svc: Mapping[str, Any], nodeports: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The fields of a Service that matter to a user. A nodePort the API server allocated is
    random: it shows as ``allocated``; one the Gateway asked for is compared by value."""
    spec = svc.get("spec") or {}
    meta = svc.get("metadata") or {}
    wanted = nodeports or {}

    def node_port(port: Mapping[str, Any]) -> Any:
        if spec.get("type") == "ClusterIP" or port.get("nodePort") is None:
            return None
        return port.get("nodePort") if port.get("name") in wanted else "allocated"

    return {
        "type": spec.get("type"),
        "ports": sorted(
            (
                {
                    "name": p.get("name"),
                    "protocol": p.get("protocol"),
                    "port": p.get("port"),
                    "targetPort": p.get("targetPort"),
                    "nodePort": node_port(p),
                }
                for p in spec.get("ports") or []
            ),
            key=lambda p: json.dumps(p, sort_keys=True),
        ),
        "selector": spec.get("selector"),
        "annotations": meta.get("annotations") or {},
        "labels": meta.get("labels") or {},
        "externalTrafficPolicy": spec.get("externalTrafficPolicy"),
        "sessionAffinity": spec.get("sessionAffinity"),
        "loadBalancerIP": spec.get("loadBalancerIP"),
    }


def allocated_addresses_named(value: Any, names: Mapping[str, str]) -> Any:
    """``value`` with every string that is an allocated address (``10.96.0.7``, or a prefix
    ``10.96.0.7/32``) replaced by what it names: two API servers allocate different ClusterIPs
    to the same Service, which is no difference between the operators."""
    if isinstance(value, dict):
        return {k: allocated_addresses_named(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [allocated_addresses_named(v, names) for v in value]
    if isinstance(value, str):
        address, slash, length = value.partition("/")
        if address in names:
            return names[address] + (slash + length if length not in ("", "32", "128") else "")
    return value


def deployment_view(dep: Mapping[str, Any]) -> dict[str, Any]:
    spec = dep.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    return {
        "kind": dep.get("kind"),
        "replicas": spec.get("replicas"),
        "selector": (spec.get("selector") or {}).get("matchLabels"),
        "podLabels": ((spec.get("template") or {}).get("metadata") or {}).get("labels"),
        "hostNetwork": pod.get("hostNetwork"),
        "terminationGracePeriodSeconds": pod.get("terminationGracePeriodSeconds"),
        "containers": [
            {
                "name": c.get("name"),
                "image": c.get("image"),
                "imagePullPolicy": c.get("imagePullPolicy"),
                "command": c.get("command"),
                "args": c.get("args"),
                "env": sorted(e.get("name", "") for e in c.get("env") or []),
                "resources": c.get("resources"),
                "livenessProbe": c.get("livenessProbe"),
                "readinessProbe": c.get("readinessProbe"),
                "ports": sorted(
                    f"{p.get('name', '')}:{p.get('containerPort')}/{p.get('protocol', 'TCP')}"
                    for p in c.get("ports") or []
                ),
            }
            for c in pod.get("containers") or []
        ],
    }


class Side:
    """What both operators share: apply a case, wait until settled, snapshot, clear."""

    name = "side"

    @property
    def admin(self) -> KubeClient:
        raise NotImplementedError

    def cds_configs(self, config_id: str = "") -> dict[str, Any]:
        """The configs the side's CDS serves by id (only ``config_id``'s, if given)."""
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def log_tail(self) -> str:
        return ""

    # --

    def apply(self, docs: list[dict[str, Any]]) -> None:
        namespaces = {d["metadata"].get("namespace") for d in docs} - {None}
        for ns in sorted(namespaces):
            self.admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        order = {"Namespace": 0, "Secret": 1, "Service": 1, "Dataplane": 2, "GatewayConfig": 3}
        for doc in sorted(docs, key=lambda d: order.get(d["kind"], 5)):
            self.admin.apply(doc)

    def snapshot(self, docs: list[dict[str, Any]]) -> Snapshot:
        snap = Snapshot()
        ids = gateway_ids(docs)
        namespaces = sorted({d["metadata"].get("namespace") for d in docs} - {None})
        with contextlib.suppress(httpx.HTTPError):
            configs = {k: v for k, v in self.cds_configs().items() if k in ids}
            snap.configs = allocated_addresses_named(configs, self._cluster_ips(namespaces))
        nodeports = requested_nodeports(docs)
        for doc in docs:
            if doc["kind"] == "GatewayClass":
                obj = self.admin.get(doc["apiVersion"], "GatewayClass", doc["metadata"]["name"])
                if obj:
                    snap.statuses[f"GatewayClass {doc['metadata']['name']}"] = status_of(obj)
        for ns in namespaces:
            for gw in self.admin.list("gateway.networking.k8s.io/v1", "Gateway", ns):
                key = f"{ns}/{gw['metadata']['name']}"
                snap.statuses[f"Gateway {key}"] = status_of(gw)
            for api_version, kind in ROUTE_KINDS:
                with contextlib.suppress(KubeError):
                    for route in self.admin.list(api_version, kind, ns):
                        key = f"{api_version} {kind} {ns}/{route['metadata']['name']}"
                        snap.statuses[key] = status_of(route)
            gateways = {g["metadata"]["name"] for g in self.admin.list(
                "gateway.networking.k8s.io/v1", "Gateway", ns)}  # fmt: skip
            for svc in self.admin.list("v1", "Service", ns):
                if _owned_by_gateway(svc, gateways):
                    key = f"{ns}/{svc['metadata']['name']}"
                    snap.services[key] = service_view(svc, nodeports.get(key))
            for kind in ("Deployment", "DaemonSet"):
                for dep in self.admin.list("apps/v1", kind, ns):
                    if _owned_by_gateway(dep, gateways):
                        snap.deployments[f"{ns}/{dep['metadata']['name']}"] = deployment_view(
                            {"kind": kind, **dep}  # list items carry no kind of their own
                        )
        return snap

    def _cluster_ips(self, namespaces: list[str]) -> dict[str, str]:
        """Each ClusterIP this API server allocated in ``namespaces``: the Service's name."""
        names: dict[str, str] = {}
        for ns in namespaces:
            for svc in self.admin.list("v1", "Service", ns):
                spec = svc.get("spec") or {}
                for ip in spec.get("clusterIPs") or [spec.get("clusterIP")]:
                    if ip and ip != "None":
                        names[ip] = f"<clusterIP {ns}/{svc['metadata']['name']}>"
        return names

    def settle(self, docs: list[dict[str, Any]]) -> Snapshot:
        """Poll until two snapshots ``SETTLE_QUIET_S`` apart are equal (bounded)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        last = self.snapshot(docs)
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
            now = self.snapshot(docs)
            if now.as_dict() != last.as_dict():
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= SETTLE_QUIET_S and _rendered(now, docs):
                return now
        return last

    def clear(self, docs: list[dict[str, Any]]) -> None:
        """Delete the case's Gateways first and wait (bounded) until the CDS drops their
        configs, then the rest. (Upstream re-renders only while a GatewayClass of its own is
        left: with the class gone first, its CDS would keep the last configs.)"""
        ids = gateway_ids(docs)
        first = [d for d in docs if d["kind"] == "Gateway"]
        rest = [d for d in reversed(docs) if d["kind"] not in ("Gateway", "Namespace")]
        for group, wait in ((first, True), (rest, False)):
            for doc in group:
                with contextlib.suppress(KubeError):
                    self.admin.delete(
                        doc["apiVersion"],
                        doc["kind"],
                        doc["metadata"]["name"],
                        doc["metadata"].get("namespace"),
                    )
            deadline = time.monotonic() + CLEAR_TIMEOUT_S
            while wait and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if not set(self.cds_configs()) & ids and not self._leftovers(ids):
                        break
                time.sleep(POLL_S)
            if wait:
                self._collect_garbage(ids)

    def _collect_garbage(self, ids: set[str]) -> None:
        """Delete what garbage collection left of the deleted Gateways. (The controller-manager's
        collector learns a new CRD's owners only at its next discovery resync, so the objects of
        the first Gateways can outlive them by half a minute.)"""
        for gw_id in ids:
            ns, name = gw_id.split("/", 1)
            selector = f"stunner.l7mp.io/related-gateway-name={name}"
            for api_version, kind in (("v1", "Service"), ("apps/v1", "Deployment")):
                for item in self.admin.list(api_version, kind, ns, label_selector=selector):
                    with contextlib.suppress(KubeError):
                        self.admin.delete(api_version, kind, item["metadata"]["name"], ns)
        deadline = time.monotonic() + CLEAR_TIMEOUT_S
        while self._leftovers(ids) and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def _leftovers(self, ids: set[str]) -> list[str]:
        """Services and Deployments of the deleted Gateways that garbage collection has not
        removed yet (an operator would adopt them, annotations and all, in the next case)."""
        out = []
        for gw_id in ids:
            ns, name = gw_id.split("/", 1)
            selector = f"stunner.l7mp.io/related-gateway-name={name}"
            for api_version, kind in (("v1", "Service"), ("apps/v1", "Deployment")):
                items = self.admin.list(api_version, kind, ns, label_selector=selector)
                out += [f"{kind} {ns}/{i['metadata']['name']}" for i in items]
        return out


def gateway_ids(docs: list[dict[str, Any]]) -> set[str]:
    return {
        f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}"
        for d in docs
        if d["kind"] == "Gateway"
    }


def _rendered(snap: Snapshot, docs: list[dict[str, Any]]) -> bool:
    """Whether every Gateway of the case has a status (the operator got to it)."""
    for doc in docs:
        if doc["kind"] == "Gateway":
            key = f"Gateway {doc['metadata'].get('namespace', 'default')}/{doc['metadata']['name']}"
            if not (snap.statuses.get(key) or {}).get("conditions"):
                return False
    return True


def _owned_by_gateway(obj: Mapping[str, Any], gateways: set[str]) -> bool:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Gateway" and ref.get("name") in gateways:
            return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get("stunner.l7mp.io/related-gateway-name") in gateways


class UpstreamSide(Side):
    name = "upstream"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.cluster = KubeCluster(workdir / "cluster")
        self.operator: ServerProcess | None = None
        self.cds_port = 0

    @property
    def admin(self) -> KubeClient:
        return self.cluster.admin

    def start(self) -> None:
        binary = gobin.upstream_operator() / "stunner-gateway-operator"
        crds = gobin.upstream_operator_source() / "config" / "crd" / "bases"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster.start()
        install_gateway_api(self.admin)
        names = []
        for path in sorted(crds.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    self.admin.apply(doc)
                    names.append(doc["metadata"]["name"])
        self.admin.wait_established(names)
        self.admin.forget_discovery()
        self.cds_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("STUNNER_")}
        env["KUBECONFIG"] = str(self.cluster.admin_kubeconfig)
        env["STUNNER_GATEWAY_OPERATOR_ADDRESS"] = LOOPBACK
        self.operator = ServerProcess(
            [
                str(binary),
                f"--config-discovery-address={LOOPBACK}:{self.cds_port}",
                "--metrics-bind-address=0",
                f"--health-probe-bind-address={LOOPBACK}:{free_port()}",
                "--leader-elect=false",
                "--zap-log-level=info",
            ],
            env=env,
            log_path=self.workdir / "upstream-operator.log",
        )
        wait_for_tcp(LOOPBACK, self.cds_port, timeout_s=60.0, proc=self.operator)

    def cds_configs(self, config_id: str = "") -> dict[str, Any]:
        path = f"/api/v1/configs/{config_id}" if config_id else "/api/v1/configs"
        reply = httpx.get(f"http://{LOOPBACK}:{self.cds_port}{path}", timeout=5.0)
        if config_id and reply.status_code == 404:
            return {}
        reply.raise_for_status()
        body = reply.json()
        items = body.get("items", [body]) if isinstance(body, dict) else body
        return {c["admin"]["name"]: c for c in items or []}

    def log_tail(self) -> str:
        return self.operator.output()[-3000:] if self.operator else ""

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
            self.operator = None
        self.cluster.stop()


class OursSide(Side):
    name = "ours"

    def __init__(self, workdir: Path) -> None:
        self.stack = KubeStack(workdir)

    @property
    def admin(self) -> KubeClient:
        return self.stack.admin

    def start(self) -> None:
        self.stack.start()
        self.admin.forget_discovery()

    def cds_configs(self, config_id: str = "") -> dict[str, Any]:
        return self.stack.cds_configs(config_id)

    def log_tail(self) -> str:
        return self.stack.operators[0].output()[-3000:] if self.stack.operators else ""

    def stop(self) -> None:
        self.stack.stop()
