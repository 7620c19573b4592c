"""The kubelet's part for the test cluster: run the stunnerd pods the operator's Deployments make.

The cluster has no nodes that run anything, so the ReplicaSet controller's pods would stay
Pending forever. ``PodRunner`` plays one node: it registers a Ready Node, binds each matching
pod to it, resolves the container's environment as a kubelet would (literals, ``$(VAR)``
references, Secrets, ConfigMaps, the downward API and the ``KUBERNETES_SERVICE_*`` variables),
starts the process its command and args describe, and reports the pod Running and Ready with a
loopback address as its pod IP, so that
the EndpointSlice controller and the operator see what a real cluster would show. A pod marked
for deletion has its process stopped and is then removed, as a kubelet confirms a deletion.

What differs from a node, and why: every pod shares this host's network namespace, so each gets
its own loopback address (127.0.0.N) as pod IP, its listeners bind that address
(``STUNNERD_BIND_HOST``) and its health port is a free one (``STUNNERD_HEALTH_PORT``) instead of
the fixed 8086 the pod template names. The image's command ``stunnerd`` is this checkout's.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.kube import KubeClient, KubeError
from support.ports import free_port
from support.processes import ServerProcess, command

NODE_NAME = "stunner-test-node"
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
PROGRAMS = {"stunnerd": ("stunnerd", "stunnerd")}


@dataclass
class RunningPod:
    namespace: str
    name: str
    uid: str
    ip: str
    health_port: int
    env: dict[str, str]
    proc: ServerProcess


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names are replaced, unknown ones kept."""
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), value)


class PodRunner:
    """Runs the pods matching ``label_selector`` in every namespace, until ``stop()``."""

    def __init__(
        self,
        client: KubeClient,
        workdir: Path,
        *,
        label_selector: str = "app=stunner",
        node_addresses: list[dict[str, str]] | None = None,
        kubelet_port: int | None = None,
        extra_env: Mapping[str, str] | None = None,
        first_ip: int = 20,
    ) -> None:
        self.client = client
        self.workdir = workdir
        self.label_selector = label_selector
        self.node_addresses = node_addresses or [{"type": "InternalIP", "address": "127.0.0.1"}]
        self.kubelet_port = kubelet_port
        """Where the API server reaches this node's kubelet API (pods/portforward): a kwok
        server (support.kwok_node) that forwards the pods' ports; None: nowhere."""
        self.extra_env = dict(extra_env or {})
        self.pods: dict[str, RunningPod] = {}
        self._next_ip = first_ip
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    # -- the node

    def register_node(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME}},
        }
        self.client.apply(node)
        now = _now()
        self.client.patch_status(
            "v1",
            "Node",
            NODE_NAME,
            None,
            {
                "addresses": self.node_addresses,
                **(
                    {"daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}}}
                    if self.kubelet_port
                    else {}
                ),
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test node",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            },
        )

    # -- pods

    def _resolve_env(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], ip: str
    ) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": ns,
            "metadata.uid": pod["metadata"].get("uid", ""),
            "spec.nodeName": NODE_NAME,
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
            "status.podIP": ip,
            "status.podIPs": ip,
            "status.hostIP": "127.0.0.1",
        }
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                found = self._secret(ns, source["secretRef"]["name"])
            else:
                found = self._configmap(ns, source["configMapRef"]["name"])
            env.update({prefix + k: v for k, v in (found or {}).items()})
        for item in container.get("env", []):
            name = item["name"]
            if "value" in item:
                env[name] = _expand(str(item["value"]), env)
                continue
            ref = item.get("valueFrom", {})
            if "fieldRef" in ref:
                env[name] = fields[ref["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in ref:
                key = ref["secretKeyRef"]
                data = self._secret(ns, key["name"])
                if data is None or key["key"] not in data:
                    raise LookupError(f"secret {ns}/{key['name']} key {key['key']} not found")
                env[name] = data[key["key"]]
            elif "configMapKeyRef" in ref:
                key = ref["configMapKeyRef"]
                data = self._configmap(ns, key["name"]) or {}
                env[name] = data[key["key"]]
            else:
                raise ValueError(f"env {name}: unsupported valueFrom {ref}")
        return env

    def _service_env(self) -> dict[str, str]:
        """What a kubelet gives every container: the API server's Service address (stunnerd
        reads it as "running in a pod")."""
        service = self.client.get("v1", "Service", "kubernetes", "default") or {}
        spec: dict[str, Any] = service.get("spec") or {}
        ports: list[dict[str, Any]] = spec.get("ports") or [{"port": 443}]
        if not spec.get("clusterIP"):
            return {}
        return {
            "KUBERNETES_SERVICE_HOST": str(spec["clusterIP"]),
            "KUBERNETES_SERVICE_PORT": str(ports[0]["port"]),
        }

    def _secret(self, ns: str, name: str) -> dict[str, str] | None:
        obj = self.client.get("v1", "Secret", name, ns)
        if obj is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}

    def _configmap(self, ns: str, name: str) -> dict[str, str] | None:
        obj = self.client.get("v1", "ConfigMap", name, ns)
        return None if obj is None else dict(obj.get("data") or {})

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        container = pod["spec"]["containers"][0]
        ip = f"127.0.0.{self._next_ip}"
        self._next_ip += 1
        env = self._resolve_env(pod, container, ip)
        argv = [
            _expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]
        ]
        if not argv or argv[0] not in PROGRAMS:
            raise ValueError(f"pod {key}: cannot run command {argv[:1]}")
        argv = [*command(*PROGRAMS[argv[0]]), *argv[1:]]
        health = free_port()
        proc_env = {
            "PATH": "/usr/bin:/bin",
            **self._service_env(),
            **env,
            "STUNNERD_BIND_HOST": ip,
            "STUNNERD_HEALTH_PORT": str(health),
            **self.extra_env,
        }
        if "TMPDIR" in proc_env and not Path(proc_env["TMPDIR"]).is_dir():
            proc_env.pop("TMPDIR")
        if meta["name"] and pod["spec"].get("nodeName") != NODE_NAME:
            self.client.request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                body={
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
                },
            )
        log = self.workdir / f"pod-{meta['namespace']}-{meta['name']}.log"
        proc = ServerProcess(argv, env=proc_env, log_path=log)
        self.pods[key] = RunningPod(
            meta["namespace"], meta["name"], meta["uid"], ip, health, env, proc
        )
        now = _now()
        ready = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        self.client.patch_status(
            "v1",
            "Pod",
            meta["name"],
            meta["namespace"],
            {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": now,
                "conditions": ready,
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container.get("image", ""),
                        "imageID": "",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    }
                ],
            },
        )

    def _finish(self, key: str) -> None:
        running = self.pods.pop(key)
        running.proc.stop()
        with contextlib.suppress(KubeError):
            self.client.request(
                "DELETE",
                f"/api/v1/namespaces/{running.namespace}/pods/{running.name}",
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": running.uid}},
                ok=(404, 409),
            )

    def sync(self) -> None:
        """One pass: start new pods, finish deleted ones."""
        pods = self.client.list("v1", "Pod", label_selector=self.label_selector)
        seen = set()
        for pod in pods:
            meta = pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            seen.add(key)
            if meta.get("deletionTimestamp"):
                if key in self.pods:
                    self._finish(key)
                else:
                    self.client.request(
                        "DELETE",
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        body={"gracePeriodSeconds": 0},
                        ok=(404, 409),
                    )
            elif key not in self.pods:
                try:
                    self._start(pod)
                except (LookupError, ValueError, KubeError) as err:
                    # A kubelet would report CreateContainerConfigError and retry.
                    if str(err) not in self.errors:
                        self.errors.append(str(err))
        for key in [k for k in self.pods if k not in seen]:
            self.pods.pop(key).proc.stop()

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            with contextlib.suppress(KubeError, OSError):
                self.sync()

    def start(self) -> PodRunner:
        self.register_node()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        for running in self.pods.values():
            running.proc.stop()
        self.pods.clear()

    def pod_for_gateway(self, namespace: str, gateway: str) -> RunningPod | None:
        for running in self.pods.values():
            if running.namespace == namespace and running.env.get("STUNNER_NAME") == gateway:
                return running
        return None


@contextlib.contextmanager
def pod_runner(client: KubeClient, workdir: Path, **kwargs: Any) -> Iterator[PodRunner]:
    runner = PodRunner(client, workdir, **kwargs)
    try:
        yield runner.start()
    finally:
        runner.stop()
