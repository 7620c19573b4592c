"""STUNner on the one-node cluster: the operator's stunnerd pods really run under the kubelet.

``NodeKubeStack`` is support.kube_stack's ``KubeStack`` (Gateway API, the chart, Redis, the CDS
and the operator as its ServiceAccount, all as local processes) on a ``NodeStack``'s cluster,
with our stunnerd image in the node's containerd. The one change: the CDS listens on the node
IP, not on 127.0.0.1, and the operator renders that address into the pods'
STUNNER_CONFIG_ORIGIN, since a pod's 127.0.0.1 is its own. The chart's in-cluster operator,
CDS and auth Deployments are scaled to zero (their processes run beside the cluster) and the
quota stays per pod (the chart's Redis does not run in the cluster either).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support.kube_stack import (
    CDS_TOKEN_SECRET,
    CONTROLLER_NAME,
    NAMESPACE,
    OPERATOR_SA,
    KubeStack,
    install_chart,
    install_gateway_api,
)
from support.node_images import stunnerd_image
from support.node_stack import NODE_IP, NodeStack
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, command, wait_for_tcp

NODE_CHART_VALUES: dict[str, Any] = {
    "operator": {"replicas": 0},
    "cds": {"replicas": 0},
    "auth": {"replicas": 0},
    "dataplane": {"clusterWideQuota": False},
}


class NodeKubeStack(KubeStack):
    def __init__(
        self,
        workdir: Path,
        *,
        node: NodeStack | None = None,
        chart_values: Mapping[str, Any] | None = None,
    ) -> None:
        """``node``: a running NodeStack to use (and leave running), else one of its own."""
        super().__init__(workdir, chart_values={**NODE_CHART_VALUES, **(chart_values or {})})
        self.own_node = node is None
        self.node = node or NodeStack(workdir / "node")
        self.cluster = self.node.cluster

    @property
    def cds_url(self) -> str:
        return f"http://{NODE_IP}:{self.cds_port}"

    def start(self) -> NodeKubeStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.own_node:
            self.node.start()
            self.node.import_image(stunnerd_image())
        install_gateway_api(self.admin)
        install_chart(self.admin, self.chart_values)
        self.cds_token = self._secret_value(CDS_TOKEN_SECRET, "token") or ""
        (self.workdir / "redis").mkdir(exist_ok=True)
        self.redis.start()
        self.start_cds()
        self.cluster.service_account_kubeconfig(NAMESPACE, OPERATOR_SA, self.operator_kubeconfig)
        self.start_operator()
        return self

    def start_cds(self) -> None:
        self.cds_port = self.cds_port or free_port(host=NODE_IP)
        env = {**os.environ, "REDIS_URL": self.redis.url}
        if self.cds_token:
            env["CDS_TOKEN"] = self.cds_token
        self.cds = ServerProcess(
            [
                *command("stunner-cds", "stunner_cds"),
                "--host",
                NODE_IP,
                "--port",
                str(self.cds_port),
            ],
            env=env,
            log_path=self.workdir / "cds.log",
        )
        wait_for_tcp(NODE_IP, self.cds_port, proc=self.cds)

    def start_operator(self, *, index: int | None = None) -> ServerProcess:
        n = len(self.operators) if index is None else index
        env = {
            **{k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
            "REDIS_URL": self.redis.url,
            "POD_NAMESPACE": NAMESPACE,
            "POD_NAME": f"stunner-operator-{n}",
            "OPERATOR_CONTROLLER_NAME": CONTROLLER_NAME,
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
                f"{NODE_IP}:{self.cds_port}",
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

    def stop(self) -> None:
        self.stop_operators()
        if self.cds is not None:
            self.cds.stop()
            self.cds = None
        self.redis.stop()
        if self.own_node:
            self.node.stop()
