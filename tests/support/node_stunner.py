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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support.kube_stack import (
    KubeStack,
)
from support.node_images import stunnerd_image
from support.node_stack import NODE_IP, NodeStack

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

    cds_host = NODE_IP  # a pod's 127.0.0.1 is its own: the CDS listens on the node's address

    def start_cluster(self) -> None:
        if self.own_node:
            self.node.start()
            self.node.import_image(stunnerd_image())

    def stop_cluster(self) -> None:
        if self.own_node:
            self.node.stop()
