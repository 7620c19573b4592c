"""STUNner on the test cluster: the chart installed, the operator running as its ServiceAccount.

``KubeStack`` starts a ``KubeCluster``, installs the official Gateway API release and
``charts/stunner`` (rendered by the real Helm engine and applied object by object, CRDs first,
as ``helm install`` does), then runs, as local processes beside the cluster:
- a redis-server (the chart's Redis Deployment never runs: the cluster has no nodes);
- the CDS, with the bearer token the chart generated into its Secret;
- the operator in Kubernetes mode, authenticated with a TokenRequest token of the chart's
  ServiceAccount ``stunner-operator``, so the chart's RBAC is what the API server enforces.

``python -m support.kube_stack up --state DIR`` (``make kube-up``) leaves it running and prints
``KUBECONFIG=``, ``CDS`` and ``CDS_TOKEN=`` lines; ``down --state DIR`` (``make kube-down``)
stops every process it started, by PID.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from support import gobin
from support.chart import chart_crds, load_documents, render
from support.kube import KubeClient, KubeCluster
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, command, wait_for_tcp
from support.redis_server import RedisServer

NAMESPACE = "stunner"
RELEASE = "stunner"
OPERATOR_SA = "stunner-operator"
CDS_TOKEN_SECRET = "stunner-cds-token"
CONTROLLER_NAME = "stunner.l7mp.io/gateway-operator"

# The chart as a user would install it for this cluster.
CHART_VALUES: dict[str, Any] = {"image": {"registry": "localhost"}}


def install_gateway_api(client: KubeClient) -> list[str]:
    """Apply the official Gateway API release; returns the CRD names (Established)."""
    names = []
    for path in gobin.gateway_api_release():
        for doc in load_documents(path.read_text()):
            client.apply(doc)
            if doc["kind"] == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    client.wait_established(names)
    return names


def install_chart(
    client: KubeClient, values: Mapping[str, Any] | None = None, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """``helm install`` without Helm's release bookkeeping: CRDs, then every rendered object."""
    crds = chart_crds()
    for crd in crds:
        client.apply(crd)
    client.wait_established([c["metadata"]["name"] for c in crds])
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    rendered = render({**CHART_VALUES, **(values or {})}, release=RELEASE, namespace=namespace)
    objects = [o for o in rendered.objects if not _is_test_hook(o)]
    # Namespaces and RBAC before the rest, as Helm's install order has it.
    order = {"Namespace": 0, "ServiceAccount": 1, "Secret": 2, "ClusterRole": 3, "Role": 3}
    applied = []
    for obj in sorted(objects, key=lambda o: order.get(o["kind"], 9)):
        applied.append(client.apply(obj, namespace=namespace))
    return applied


def _is_test_hook(obj: Mapping[str, Any]) -> bool:
    hook = (obj.get("metadata", {}).get("annotations") or {}).get("helm.sh/hook", "")
    return "test" in hook


def echo_gateway(
    gateway: str,
    listener: str,
    port: int,
    *,
    route: bool = True,
    config_spec: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """GatewayClass -> GatewayConfig (static user-1/pass-1) -> a TURN-UDP Gateway with a
    LoadBalancer Service, a StaticService admitting 127.0.0.1 and (``route``) a UDPRoute to it:
    what a relay test through the cluster needs."""
    config = {
        "realm": "stunner.l7mp.io",
        "authType": "static",
        "userName": "user-1",
        "password": "pass-1",
        **(config_spec or {}),
    }
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": {"name": "stunner-gatewayconfig", "namespace": NAMESPACE},
            "spec": config,
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "stunner-gatewayclass"},
            "spec": {
                "controllerName": CONTROLLER_NAME,
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": "stunner-gatewayconfig",
                    "namespace": NAMESPACE,
                },
            },
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {
                "name": gateway,
                "namespace": NAMESPACE,
                "annotations": {"stunner.l7mp.io/service-type": "LoadBalancer"},
            },
            "spec": {
                "gatewayClassName": "stunner-gatewayclass",
                "listeners": [{"name": listener, "port": port, "protocol": "TURN-UDP"}],
            },
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "StaticService",
            "metadata": {"name": "echo", "namespace": NAMESPACE},
            "spec": {"prefixes": [f"{LOOPBACK}/32"]},
        },
    ]
    if route:
        objects.append(echo_route(gateway))
    return objects


def echo_route(gateway: str) -> dict[str, Any]:
    """The UDPRoute of ``echo_gateway``: the Gateway to the StaticService ``echo``."""
    backend = {"group": "stunner.l7mp.io", "kind": "StaticService", "name": "echo"}
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "UDPRoute",
        "metadata": {"name": "echo-route", "namespace": NAMESPACE},
        "spec": {"parentRefs": [{"name": gateway}], "rules": [{"backendRefs": [backend]}]},
    }


class KubeStack:
    def __init__(
        self,
        workdir: Path,
        *,
        chart_values: Mapping[str, Any] | None = None,
        operator_env: Mapping[str, str] | None = None,
        **cluster_options: Any,
    ) -> None:
        self.workdir = workdir
        self.cluster = KubeCluster(workdir / "cluster", **cluster_options)
        self.operator_env = dict(operator_env or {})
        self.chart_values = dict(chart_values or {})
        self.redis = RedisServer(workdir / "redis")
        self.cds_port = 0
        self.cds: ServerProcess | None = None
        self.operators: list[ServerProcess] = []
        self.cds_token = ""
        self.operator_kubeconfig = workdir / "operator.kubeconfig"

    @property
    def admin(self) -> KubeClient:
        return self.cluster.admin

    @property
    def cds_url(self) -> str:
        return f"http://{self.cds_host}:{self.cds_port}"

    cds_host = LOOPBACK
    """Where the CDS listens and the operator tells stunnerd pods to find it."""

    def start_cluster(self) -> None:
        self.cluster.start()

    def stop_cluster(self) -> None:
        self.cluster.stop()

    def start(self) -> KubeStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start_cluster()
        install_gateway_api(self.admin)
        install_chart(self.admin, self.chart_values)
        self.cds_token = self._secret_value(CDS_TOKEN_SECRET, "token") or ""
        (self.workdir / "redis").mkdir(exist_ok=True)
        self.redis.start()
        self.start_cds()
        self.cluster.service_account_kubeconfig(NAMESPACE, OPERATOR_SA, self.operator_kubeconfig)
        self.start_operator()
        return self

    def _secret_value(self, name: str, key: str) -> str | None:
        secret = self.admin.wait_for(
            f"secret {NAMESPACE}/{name}", lambda: self.admin.get("v1", "Secret", name, NAMESPACE)
        )
        data = secret.get("data") or {}
        return base64.b64decode(data[key]).decode() if key in data else None

    def start_cds(self) -> None:
        self.cds_port = self.cds_port or free_port(host=self.cds_host)
        env = {**os.environ, "REDIS_URL": self.redis.url}
        if self.cds_token:
            env["CDS_TOKEN"] = self.cds_token
        self.cds = ServerProcess(
            [
                *command("stunner-cds", "stunner_cds"),
                "--host",
                self.cds_host,
                "--port",
                str(self.cds_port),
            ],
            env=env,
            log_path=self.workdir / "cds.log",
        )
        wait_for_tcp(self.cds_host, self.cds_port, proc=self.cds)

    def start_operator(self, *, index: int | None = None) -> ServerProcess:
        """One more operator replica (they elect a leader through a Lease)."""
        n = len(self.operators) if index is None else index
        env = {
            **{k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
            "REDIS_URL": self.redis.url,
            "POD_NAMESPACE": NAMESPACE,
            "POD_NAME": f"stunner-operator-{n}",
            "OPERATOR_CONTROLLER_NAME": CONTROLLER_NAME,
            "OPERATOR_LEASE_DURATION_S": "4",
            "OPERATOR_LEASE_RENEW_S": "1",
            **self.operator_env,
        }
        if self.cds_token:
            env["OPERATOR_CDS_TOKEN_SECRET"] = CDS_TOKEN_SECRET
        proc = ServerProcess(
            [
                *command("stunner-operator", "stunner_operator"),
                "--kubeconfig",
                str(self.operator_kubeconfig),
                "--cds-address",
                f"{self.cds_host}:{self.cds_port}",
                "--health-address",
                f"{LOOPBACK}:{free_port()}",
                "--metrics-address",
                f"{LOOPBACK}:{free_port()}",
            ],
            env=env,
            log_path=self.workdir / f"operator-{n}.log",
        )
        if index is None:
            self.operators.append(proc)
        else:
            self.operators[index] = proc
        return proc

    def stop_operators(self) -> None:
        for proc in self.operators:
            proc.stop()

    def cds_configs(self, config_id: str = "") -> dict[str, Any]:
        """Every config the CDS serves, by ``namespace/name`` (only ``config_id``'s if given:
        ``GET /api/v1/configs/NS/NAME``; none where the CDS has no such config)."""
        headers = {"Authorization": f"Bearer {self.cds_token}"} if self.cds_token else {}
        path = f"/api/v1/configs/{config_id}" if config_id else "/api/v1/configs"
        response = httpx.get(f"{self.cds_url}{path}", headers=headers, timeout=5.0)
        if config_id and response.status_code == 404:
            return {}
        response.raise_for_status()
        body = response.json()
        items = body.get("items", [body]) if isinstance(body, dict) else body
        out = {}
        for cfg in items:
            admin = cfg.get("admin", {})
            out[admin.get("name", "")] = cfg
        return out

    def stop(self) -> None:
        self.stop_operators()
        if self.cds is not None:
            self.cds.stop()
            self.cds = None
        self.redis.stop()
        self.stop_cluster()

    # -- make kube-up / kube-down

    def pids(self) -> list[int]:
        procs = [
            self.cluster.etcd,
            self.cluster.apiserver,
            self.cluster.controller_manager,
            self.redis.proc,
            self.cds,
            *self.operators,
        ]
        return [p.pid for p in procs if p is not None]


def _up(state: Path) -> int:
    if (state / "pids.json").exists():
        print(f"a test cluster is already up (state in {state}); run make kube-down first")
        return 1
    if state.exists():
        shutil.rmtree(state)  # a previous cluster's storage and keys: start afresh
    started = time.monotonic()
    stack = KubeStack(state)
    try:
        stack.start()
    except Exception as err:
        print(f"kube-up failed: {err}", file=sys.stderr)
        stack.stop()
        return 1
    (state / "pids.json").write_text(json.dumps(stack.pids()))
    print(f"KUBECONFIG={stack.cluster.admin_kubeconfig}")
    print(f"CDS {stack.cds_url}")
    if stack.cds_token:
        print(f"CDS_TOKEN={stack.cds_token}")
    print(f"# up in {time.monotonic() - started:.0f}s; logs in {state}; stop with make kube-down")
    return 0


def _down(state: Path) -> int:
    pids_file = state / "pids.json"
    if not pids_file.exists():
        print("no test cluster is up")
        return 0
    for pid in reversed(json.loads(pids_file.read_text())):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10.0
    for pid in json.loads(pids_file.read_text()):
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    pids_file.unlink()
    print("test cluster stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kube_stack", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state", type=Path, default=Path(".run/kube"))
    args = parser.parse_args(argv)
    state = args.state.resolve()
    return _up(state) if args.action == "up" else _down(state)


if __name__ == "__main__":
    raise SystemExit(main())
