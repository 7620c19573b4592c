"""charts/stunner installed by the real ``helm`` CLI into the one-node cluster (support.node_stack).

Helm 4 (``helm.sh/helm/v4/cmd/helm``, built by support.gobin) installs the chart with its default
values; the only override is the Redis image (the chart's default ``redis:7-alpine`` is on a
public registry: ``localhost/stunner-redis-server``, see support.node_images). The operator,
the CDS replicas, Redis and the auth service then run as pods from our images, the operator
with its in-cluster configuration (the API server is on the node IP, reached through the
``kubernetes`` Service). ``NodeRelease`` also loads the images into the node's containerd
and runs upstream's udp-echo walkthrough pieces (the echo Deployment and Service).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support import gobin
from support.kube import KubeClient, KubeError
from support.kube_stack import NAMESPACE, RELEASE, install_gateway_api
from support.node_images import (
    HELM_IMAGES,
    UDP_ECHO_IMAGE,
    UDP_ECHO_PORT,
    ctr_import,
    missing_images,
    redis_server_image,
    stunner_image,
    stunner_version,
    udp_echo_archive,
)
from support.node_stack import NodeStack

CHART = gobin.REPO / "charts" / "stunner"
HELM_TIMEOUT_S = 300.0
LEASE = "stunner-gateway-operator"
CHART_COMPONENTS = {"operator": 1, "cds": 2, "redis": 1, "auth": 1}
"""The chart's Deployments (label app.kubernetes.io/component) and their default replicas."""


class HelmError(RuntimeError):
    """A helm command failed; the message carries its output."""


def helm_binary() -> Path:
    return gobin.helm() / "helm"


def release_values() -> list[str]:
    """``--set`` flags of the install: the chart's defaults but for the Redis image."""
    return [
        "--set",
        "redis.image.repository=localhost/stunner-redis-server",
        "--set",
        f"redis.image.tag={stunner_version()}",
    ]


@dataclass
class Helm:
    """The helm CLI against one cluster, its cache, config and data under ``home``."""

    binary: Path
    kubeconfig: Path
    home: Path
    log: list[str] = field(default_factory=list)

    def run(self, *args: str, timeout_s: float = HELM_TIMEOUT_S) -> str:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
            env=env,
        )
        output = done.stdout + done.stderr
        self.log.append(f"$ helm {' '.join(args)}\n{output}")
        if done.returncode != 0:
            raise HelmError(f"helm {' '.join(args)} (exit {done.returncode}):\n{output[-4000:]}")
        return output


def pod_ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def component_pods(admin: KubeClient, component: str) -> list[dict[str, Any]]:
    pods = admin.list(
        "v1", "Pod", NAMESPACE, label_selector=f"app.kubernetes.io/component={component}"
    )
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def pod_summary(admin: KubeClient, namespace: str = NAMESPACE) -> str:
    """One line per pod: name, phase, and each container's state (waiting reason, restarts)."""
    lines = []
    for pod in admin.list("v1", "Pod", namespace):
        states = []
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            state = next(iter(c.get("state") or {"?": {}}))
            detail = (c.get("state") or {}).get(state) or {}
            reason = detail.get("reason") or ""
            message = (detail.get("message") or "")[:300]
            states.append(f"{c['name']}:{state}/{reason} restarts={c['restartCount']} {message}")
        phase = (pod.get("status") or {}).get("phase")
        lines.append(f"{pod['metadata']['name']} {phase} {'; '.join(states)}")
    return "\n".join(lines)


class NodeRelease:
    """The chart installed by helm into ``node``'s cluster (release ``stunner`` in ``stunner``)."""

    def __init__(self, node: NodeStack, workdir: Path) -> None:
        self.node = node
        self.workdir = workdir
        self.helm = Helm(helm_binary(), node.cluster.admin_kubeconfig, workdir / "helm")
        self.chart = CHART
        self.timings: dict[str, float] = {}

    @property
    def admin(self) -> KubeClient:
        return self.node.admin

    def load_images(self) -> None:
        """Our images, the Redis server image and the udp-echo image into the node."""
        started = time.monotonic()
        for name in HELM_IMAGES:
            if name != "redis":
                self.node.import_image(stunner_image(name))
        self.node.import_image(redis_server_image())
        ctr_import(self.node.socket, udp_echo_archive(self.workdir / "udp-echo.tar"))
        self.timings["image-load"] = round(time.monotonic() - started, 1)

    def install(self) -> str:
        install_gateway_api(self.admin)
        started = time.monotonic()
        output = self.helm.run(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            *release_values(),
        )
        self.timings["helm-install"] = round(time.monotonic() - started, 1)
        return output

    def all_ready(self) -> bool:
        for component, replicas in CHART_COMPONENTS.items():
            pods = component_pods(self.admin, component)
            if len(pods) != replicas or not all(pod_ready(p) for p in pods):
                return False
        return True

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        started = time.monotonic()
        try:
            self.admin.wait_for("the chart's pods Ready", self.all_ready, timeout_s=timeout_s)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{pod_summary(self.admin)}") from None
        self.timings["pods-ready"] = round(time.monotonic() - started, 1)

    def lease_holder(self) -> str:
        lease = self.admin.get("coordination.k8s.io/v1", "Lease", LEASE, NAMESPACE) or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def pod_log(self, name: str, namespace: str = NAMESPACE, *, previous: bool = False) -> str:
        params = {"previous": "true"} if previous else None
        log = self.admin.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log", params=params, ok=(400, 404)
        )
        return log if isinstance(log, str) else repr(log)

    def upgrade(self, *values: str) -> str:
        """``helm upgrade --reuse-values --set V ...`` of the release, as a user changes it."""
        sets = [arg for value in values for arg in ("--set", value)]
        return self.helm.run(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values", *sets
        )

    def uninstall(self) -> None:
        self.helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")

    def remove(self, *cluster_scoped: tuple[str, str, str]) -> None:
        """Leave the node as the next module expects it: no release, no ``stunner`` namespace,
        none of ``cluster_scoped`` ((apiVersion, kind, name): GatewayClasses, Dataplanes).
        Best effort: what is already gone is skipped."""
        admin = self.admin
        with contextlib.suppress(HelmError, KubeError):
            self.uninstall()
        for api_version, kind, name in cluster_scoped:
            with contextlib.suppress(KubeError):
                admin.delete(api_version, kind, name)
        with contextlib.suppress(KubeError):
            # stunnerd's grace period is the chart's 3600 s (it drains live allocations).
            admin.request(
                "DELETE",
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                params={"gracePeriodSeconds": "0"},
            )
            admin.delete("v1", "Namespace", NAMESPACE)
        with contextlib.suppress(TimeoutError):
            admin.wait_for(
                "namespace stunner gone",
                lambda: admin.get("v1", "Namespace", NAMESPACE) is None,
                timeout_s=120,
                interval_s=1.0,
            )


def udp_echo(namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """What the walkthrough's ``kubectl create deployment udp-echo`` and ``kubectl expose
    deployment udp-echo --type=ClusterIP --protocol=UDP --port=9001`` make, with the local
    echo image (the walkthrough's ``l7mp/net-debug`` with socat needs a registry)."""
    labels = {"app": "udp-echo"}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "udp-echo", "namespace": namespace, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [
                            {
                                "name": "net-debug",
                                "image": UDP_ECHO_IMAGE,
                                "imagePullPolicy": "Never",
                                "ports": [{"containerPort": UDP_ECHO_PORT, "protocol": "UDP"}],
                            }
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "udp-echo", "namespace": namespace, "labels": labels},
            "spec": {
                "type": "ClusterIP",
                "selector": labels,
                "ports": [{"port": UDP_ECHO_PORT, "protocol": "UDP", "targetPort": UDP_ECHO_PORT}],
            },
        },
    ]


def software_missing(reason: str) -> None:
    """Software the node tests need is missing: skip, but fail under CI=true (as
    tests/node/conftest.py does: CI must run them)."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " (CI must run the node tests)")
    pytest.skip(reason)


@contextlib.contextmanager
def installed_release(
    node: NodeStack, workdir: Path, *cluster_scoped: tuple[str, str, str]
) -> Iterator[NodeRelease]:
    """The chart installed by helm with every pod Ready; afterwards the release, the namespace
    and ``cluster_scoped`` (see `NodeRelease.remove`) are gone. Skips (fails under CI) where
    the images or the helm CLI are missing."""
    missing = missing_images()
    if missing:
        software_missing(
            f"podman has no {', '.join(missing)}: run scripts/images.py "
            "stunnerd cds operator auth turncat redis"
        )
    try:
        started = time.monotonic()
        gobin.helm()
        build_s = time.monotonic() - started
    except gobin.GoBuildError as err:
        software_missing(f"the helm CLI did not build: {err}")
    rel = NodeRelease(node, workdir)
    rel.timings["helm-build"] = round(build_s, 1)
    try:
        rel.load_images()
        rel.install()
        rel.wait_ready()
        yield rel
    finally:
        rel.remove(*cluster_scoped)
