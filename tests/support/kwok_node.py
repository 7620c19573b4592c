"""A kwok node behind the test cluster's API server, for ``kubectl port-forward``-style tests.

The test cluster has no kubelet, so ``pods/portforward`` has nobody to reach. kwok
(``sigs.k8s.io/kwok``, pinned in support.gobin) simulates nodes and, for the pods bound to
them, serves the kubelet's streaming API, port-forward included, from the same streaming code
the kubelet uses: its PortForward resources say where a pod port really goes (here the CDS
process on a loopback port). ``KwokNode`` registers one node that kwok manages, with
InternalIP 127.0.0.1 and kwok's server port as the kubelet port; the API server dials it there
(the cluster runs with ``--kubelet-preferred-address-types=InternalIP``, see ``APISERVER_ARGS``).
``bind`` does the scheduler's part for one pod; kwok then reports it Running and Ready.
``restart`` stops and starts kwok on the same port: every open port-forward stream breaks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support import gobin
from support.kube import KubeClient, write_kubeconfig
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, wait_for_tcp

NODE_NAME = "stunner-kwok-node"
APISERVER_ARGS = ("--kubelet-preferred-address-types=InternalIP",)
"""kwok gives its node a Hostname address (the node name) beside the InternalIP: the API server
must dial the IP."""


STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat/node-heartbeat.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


@dataclass(frozen=True, slots=True)
class Forward:
    """Port ``port`` of pod ``namespace/pod`` is ``address:target``."""

    namespace: str
    pod: str
    port: int
    target: int
    address: str = LOOPBACK


class KwokNode:
    def __init__(
        self,
        client: KubeClient,
        workdir: Path,
        *,
        server: str,
        ca_cert: Path,
        admin_cert: tuple[Path, Path],
    ) -> None:
        self.client = client
        self.workdir = workdir
        self.kubeconfig = workdir / "kwok.kubeconfig"
        self.config = workdir / "kwok.yaml"
        self.port = free_port()
        self.proc: ServerProcess | None = None
        self.forwards: list[Forward] = []
        self.starts = 0
        workdir.mkdir(parents=True, exist_ok=True)
        write_kubeconfig(self.kubeconfig, server, ca_cert, user="kwok", client_cert=admin_cert)

    def _write_config(self) -> None:
        docs: list[dict[str, Any]] = [
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "PortForward",
                "metadata": {"name": f.pod, "namespace": f.namespace},
                "spec": {
                    "forwards": [
                        {"ports": [f.port], "target": {"address": f.address, "port": f.target}}
                    ]
                },
            }
            for f in self.forwards
        ]
        # kwok's own stages: nodes become Ready and keep heartbeating, bound pods Ready.
        stages = gobin.module_dir(gobin.KWOK, gobin.KWOK_VERSION) / "kustomize" / "stage"
        texts = [(stages / part).read_text() for part in STAGES]
        self.config.write_text("\n---\n".join([*texts, yaml.safe_dump_all(docs)]))

    def start(self, forwards: Sequence[Forward] = ()) -> KwokNode:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.forwards = list(forwards) or self.forwards
        self._write_config()
        self.client.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME}})
        binary = gobin.kwok() / "kwok"
        self.starts += 1
        self.proc = ServerProcess(
            [
                str(binary),
                f"--config={self.config}",
                f"--kubeconfig={self.kubeconfig}",
                f"--manage-single-node={NODE_NAME}",
                f"--node-ip={LOOPBACK}",
                f"--node-port={self.port}",
                f"--server-address={LOOPBACK}:{self.port}",
                "--node-lease-duration-seconds=0",
            ],
            env={**os.environ, "HOME": str(self.workdir)},
            log_path=self.workdir / f"kwok-{self.starts}.log",
        )
        wait_for_tcp(LOOPBACK, self.port, timeout_s=30.0, proc=self.proc)

        def node_ready() -> bool:
            node = self.client.get("v1", "Node", NODE_NAME) or {}
            status = node.get("status") or {}
            port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            return ready and port == self.port

        self.client.wait_for("the kwok node ready", node_ready, timeout_s=30.0)
        return self

    def bind(self, namespace: str, pod: str) -> dict[str, Any]:
        """Schedule ``pod`` onto this node; returns it once kwok reports it Ready."""
        self.client.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{pod}/binding",
            body={
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": pod, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
            },
        )

        def ready() -> dict[str, Any] | None:
            found = self.client.get("v1", "Pod", pod, namespace) or {}
            conditions = (found.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                return found
            return None

        result: dict[str, Any] = self.client.wait_for(f"pod {pod} ready on kwok", ready)
        return result

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(Exception):
            self.client.delete("v1", "Node", NODE_NAME)


@contextlib.contextmanager
def kwok_node(client: KubeClient, workdir: Path, **kwargs: Any) -> Iterator[KwokNode]:
    node = KwokNode(client, workdir, **kwargs)
    try:
        yield node
    finally:
        node.close()
