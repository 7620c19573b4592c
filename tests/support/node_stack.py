"""A one-node Kubernetes cluster on this machine: a real kubelet, containerd, CNI and kube-proxy.

``NodeStack`` starts, as processes it stops by PID:
- the control plane of support.kube (etcd, kube-apiserver, kube-controller-manager), plus
  kube-scheduler, all version-stamped builds of tests/kube's k8s.io/kubernetes (support.gobin);
- containerd (the system's, Debian's 1.6 with runc) with its own config, root, state and socket
  in the stack's folder; the pause image is made locally (support.node_images);
- the kubelet (cgroupfs driver, cgroup v1 allowed, the API server's CA for client certificates,
  webhook authorization, its root, pod logs and volume plugins under the stack's folder);
- CNI from /usr/lib/cni: a bridge of our own whose gateway is the node IP, host-local IPAM on a
  private pod CIDR, portmap and loopback; pods get routes to the pod and Service CIDRs only;
- kube-proxy in iptables mode, so Service ClusterIPs and NodePorts work.

Everything it changes on the host (support.node_net) is recorded at start and undone on stop.
``python -m support.node_stack up --state DIR`` leaves it running (``make node-up``) and
``down --state DIR`` (``make node-down``) takes it down from the state file alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from support import gobin
from support.kube import SERVICE_CIDR, KubeClient, KubeCluster, KubeError, write_kubeconfig
from support.node_images import PAUSE_IMAGE, ctr_import, import_podman_image, pause_archive
from support.node_net import (
    HostSnapshot,
    cni_sandboxes,
    create_bridge,
    delete_bridge,
    guard_egress,
    remove_cni_state,
    sandbox_netns,
    shim_pids,
    unmount_under,
)
from support.node_pki import make_node_pki
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, which

NODE_NAME = "stunner-node"
BRIDGE = "stunnode0"
POD_CIDR = "10.244.0.0/24"
NODE_IP = "10.244.0.1"  # the bridge's address: the pods' gateway and the node's InternalIP
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the ``kubernetes`` Service: the first of SERVICE_CIDR
CNI_NETWORK = "stunner-node"
CNI_BIN = Path("/usr/lib/cni")
CLUSTER_DOMAIN = "cluster.local"
CAP_SYS_RESOURCE = 24
COREDNS = "github.com/coredns/coredns"
COREDNS_VERSION = "v1.14.7"
NODE_READY_TIMEOUT_S = 120.0
TEARDOWN_TIMEOUT_S = 60.0


class NodeStackError(RuntimeError):
    """A component would not start or become ready; the message carries its own log tail."""


def machine_lacks() -> list[str]:
    """What the machine itself does not offer for a node (no package install would help)."""
    lacking = []
    if os.geteuid() != 0:
        lacking.append("not root (the kubelet, containerd and CNI need it)")
    if not Path("/proc/sys/net/bridge").exists():
        lacking.append("no br_netfilter (/proc/sys/net/bridge is missing)")
    if not Path("/sys/fs/cgroup").is_dir():
        lacking.append("no cgroup file system at /sys/fs/cgroup")
    return lacking


def missing_requirements() -> list[str]:
    """Software a node needs that is not installed (empty: all there)."""
    missing = []
    for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip"):
        if which(tool) is None:
            missing.append(f"{tool} (not installed)")
    for plugin in ("bridge", "host-local", "portmap", "loopback"):
        if not (CNI_BIN / plugin).exists():
            missing.append(f"CNI plugin {CNI_BIN / plugin} (containernetworking-plugins)")
    if gobin.go_binary() is None:
        missing.append("the Go toolchain (the Kubernetes binaries are built from tests/kube)")
    return missing


def containerd_config(work: Path) -> str:
    root = work / "containerd"
    return f"""\
version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{root / "containerd.sock"}"

[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
  enable_selinux = false
{_oom_line()}  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{which("runc") or "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{work / "cni" / "net.d"}"
    max_conf_num = 1
"""


def _oom_line() -> str:
    """Without CAP_SYS_RESOURCE (this machine's bounding set lacks it) nothing may lower an
    oom_score_adj: runc fails a sandbox (-998) with "can't get final child's PID from pipe:
    EOF". containerd then clamps every score to its own, as it does for rootless runs."""
    if has_capability(CAP_SYS_RESOURCE):
        return ""
    return "  restrict_oom_score_adj = true\n"


def has_capability(bit: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def cni_config(work: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    # No default route: a pod reaches the pod network, the node and Services.
                    "routes": [{"dst": SERVICE_CIDR}],
                    "dataDir": str(work / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    work: Path, ca_cert: Path, sock: Path, ports: dict[str, int], dns: list[str]
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine mounts cgroup v1 (hybrid): since 1.35 the kubelet refuses it unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{sock}",
        "address": NODE_IP,
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": LOOPBACK,
        "healthzPort": ports["kubelet-healthz"],
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "failSwapOn": False,
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": dns,
        # Pods get no nameserver of the host's: nothing outside the machine is reachable.
        "resolvConf": "",
        "podLogsDir": str(work / "pod-logs"),
        "staticPodPath": "",
        "serializeImagePulls": False,
        # Imported images are all there is: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
        "maxPods": 30,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": True,
    }


def kube_proxy_config(kubeconfig: Path, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "healthzBindAddress": f"{LOOPBACK}:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"{LOOPBACK}:{ports['kube-proxy-metrics']}",
        "clusterCIDR": POD_CIDR,
        "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # 0: leave the machine's conntrack table size and timeouts as they are.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False, "syncPeriod": "5s"},
    }


class NodeStack:
    """The control plane, containerd, a kubelet and kube-proxy in ``workdir`` (see the module)."""

    def __init__(self, workdir: Path, *, dns: bool = True) -> None:
        self.workdir = workdir.resolve()
        self.dns = dns
        """Run CoreDNS for cluster.local on the node IP (the pods' nameserver)."""
        self.dns_unavailable = "" if dns else "not asked for"
        """Why there is no cluster DNS (CoreDNS would not build or start), or empty."""
        self.cluster = KubeCluster(
            self.workdir / "cluster",
            apiserver_args=[
                # So the API server can reach the kubelet (logs, exec) as the admin.
                f"--kubelet-client-certificate={self.workdir / 'cluster' / 'pki' / 'admin.crt'}",
                f"--kubelet-client-key={self.workdir / 'cluster' / 'pki' / 'admin.key'}",
                "--kubelet-preferred-address-types=InternalIP",
            ],
            # On the node IP, with the lease reconciler pointing the ``kubernetes`` Service at
            # it and a certificate naming it and 10.96.0.1: pods reach the API server with
            # their in-cluster configuration (ServiceAccount token, KUBERNETES_SERVICE_HOST).
            host=NODE_IP,
            endpoint_reconciler="lease",
            pki=partial(make_node_pki, ips=[NODE_IP, KUBERNETES_SERVICE_IP, LOOPBACK]),
        )
        self.procs: dict[str, ServerProcess] = {}
        self.snapshot: HostSnapshot | None = None
        self.ports: dict[str, int] = {}
        self.node_bins: Path | None = None
        self.bridge_created = False
        self.timings: dict[str, float] = {}
        """Seconds each start step took (binaries, control plane, containerd, node Ready...)."""

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def admin(self) -> KubeClient:
        return self.cluster.admin

    @property
    def state_file(self) -> Path:
        return self.workdir / "node-state.json"

    # -- start

    def start(self) -> NodeStack:
        missing = machine_lacks() + missing_requirements()
        if missing:
            raise NodeStackError("this machine cannot run a node: " + "; ".join(missing))
        self.workdir.mkdir(parents=True, exist_ok=True)
        step = time.monotonic()
        node_bins = self.node_bins = gobin.node_binaries()
        gobin.kube_binaries()
        pause = pause_archive(self.workdir / "pause.tar")
        self._timed("binaries", step)
        self.snapshot = HostSnapshot.take()
        self._write_state()
        # The bridge first: the API server listens on its address, the node IP.
        create_bridge(BRIDGE, f"{NODE_IP}/{POD_CIDR.split('/')[1]}")
        self.bridge_created = True
        self._write_state()
        guard_egress(BRIDGE, POD_CIDR)
        step = time.monotonic()
        self.cluster.start()
        self._record_cluster_procs()
        self._timed("control-plane", step)
        step = time.monotonic()
        self._start_scheduler(node_bins)
        self._write_cni()
        self._start_containerd()
        ctr_import(self.socket, pause)
        self._timed("containerd", step)
        step = time.monotonic()
        if self.dns:
            self._start_coredns()
        self._start_kubelet(node_bins)
        self._start_kube_proxy(node_bins)
        self.wait_node_ready()
        self._timed("node-ready", step)
        return self

    def _timed(self, name: str, since: float) -> None:
        self.timings[name] = round(time.monotonic() - since, 1)

    def _record_cluster_procs(self) -> None:
        for name, proc in (
            ("etcd", self.cluster.etcd),
            ("kube-apiserver", self.cluster.apiserver),
            ("kube-controller-manager", self.cluster.controller_manager),
        ):
            if proc is not None:
                self.procs[name] = proc
        self._write_state()

    def _spawn(self, name: str, argv: list[str]) -> ServerProcess:
        proc = ServerProcess(argv, log_path=self.workdir / f"{name}.log")
        self.procs[name] = proc
        self._write_state()
        return proc

    def _write_state(self) -> None:
        pki = self.cluster.pki
        state = {
            "pids": {name: p.pid for name, p in self.procs.items()},
            "socket": str(self.socket),
            "kube-proxy": str(self.node_bins / "kube-proxy") if self.node_bins else None,
            "server": self.cluster.server if self.cluster.port else None,
            "ca": str(pki.ca_cert) if pki else None,
            "admin": [str(pki.admin_cert), str(pki.admin_key)] if pki else None,
            "snapshot": self.snapshot.to_json() if self.snapshot else None,
            "bridge": self.bridge_created,
        }
        self.state_file.write_text(json.dumps(state, indent=1))

    def _admin_kubeconfig(self) -> Path:
        return self.cluster.admin_kubeconfig

    def _start_scheduler(self, bins: Path) -> None:
        kubeconfig = self._admin_kubeconfig()
        port = free_port()
        proc = self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        _wait_https_ok(proc, f"https://{LOOPBACK}:{port}/healthz", 60.0)

    def _write_cni(self) -> None:
        conf_dir = self.workdir / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "cni" / "ipam").mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-stunner-node.conflist").write_text(
            json.dumps(cni_config(self.workdir), indent=1)
        )

    def _start_containerd(self) -> None:
        config = self.workdir / "containerd" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(containerd_config(self.workdir))
        proc = self._spawn(
            "containerd",
            [which("containerd") or "containerd", "--config", str(config), "--log-level", "info"],
        )
        deadline = time.monotonic() + 30.0
        while True:
            if not proc.alive():
                raise NodeStackError(f"containerd exited:\n{proc.output()[-3000:]}")
            done = subprocess.run(
                ["ctr", "-a", str(self.socket), "version"], capture_output=True, check=False
            )
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise NodeStackError(f"containerd not answering:\n{proc.output()[-3000:]}")
            time.sleep(0.2)

    def _start_coredns(self) -> None:
        """CoreDNS on the node IP, port 53, serving cluster.local from the API server (as the
        admin); nothing else: names outside the cluster get SERVFAIL, nothing is forwarded."""
        try:
            binary = gobin.install(COREDNS, COREDNS_VERSION, [""]) / "coredns"
        except gobin.GoBuildError as err:
            self.dns_unavailable = f"CoreDNS {COREDNS_VERSION} did not build: {err}"
            return
        ddir = self.workdir / "coredns"
        ddir.mkdir(parents=True, exist_ok=True)
        self.ports["coredns-ready"] = free_port()
        (ddir / "Corefile").write_text(
            f"""\
{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {NODE_IP}
    errors
    ready {LOOPBACK}:{self.ports["coredns-ready"]}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self._admin_kubeconfig()} stunner-test
        pods insecure
        ttl 5
    }}
}}
.:53 {{
    bind {NODE_IP}
    errors
}}
"""
        )
        proc = self._spawn("coredns", [str(binary), "-conf", str(ddir / "Corefile")])
        deadline = time.monotonic() + 30.0
        url = f"http://{LOOPBACK}:{self.ports['coredns-ready']}/ready"
        while True:
            if not proc.alive():
                raise NodeStackError(f"coredns exited:\n{proc.output()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise NodeStackError(f"coredns not ready:\n{proc.output()[-3000:]}")
            time.sleep(0.25)

    def _start_kubelet(self, bins: Path) -> None:
        assert self.cluster.pki is not None
        kdir = self.workdir / "kubelet"
        (kdir / "root").mkdir(parents=True, exist_ok=True)
        (self.workdir / "pod-logs").mkdir(parents=True, exist_ok=True)
        self.ports.update({"kubelet": free_port(), "kubelet-healthz": free_port()})
        config = kdir / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(
                    self.workdir,
                    self.cluster.pki.ca_cert,
                    self.socket,
                    self.ports,
                    [NODE_IP] if "coredns" in self.procs else [],
                )
            )
        )
        kubeconfig = write_kubeconfig(
            kdir / "kubeconfig",
            self.cluster.server,
            self.cluster.pki.ca_cert,
            user="kubelet",
            client_cert=(self.cluster.pki.admin_cert, self.cluster.pki.admin_key),
        )
        self._spawn(
            "kubelet",
            [
                str(bins / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={kdir / 'root'}",
                f"--cert-dir={kdir / 'pki'}",
                f"--volume-plugin-dir={kdir / 'volume-plugins'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "--v=2",
            ],
        )

    def _start_kube_proxy(self, bins: Path) -> None:
        assert self.cluster.pki is not None
        pdir = self.workdir / "kube-proxy"
        pdir.mkdir(parents=True, exist_ok=True)
        self.ports.update({"kube-proxy-healthz": free_port(), "kube-proxy-metrics": free_port()})
        kubeconfig = write_kubeconfig(
            pdir / "kubeconfig",
            self.cluster.server,
            self.cluster.pki.ca_cert,
            user="kube-proxy",
            client_cert=(self.cluster.pki.admin_cert, self.cluster.pki.admin_key),
        )
        config = pdir / "config.yaml"
        config.write_text(yaml.safe_dump(kube_proxy_config(kubeconfig, self.ports)))
        self._spawn("kube-proxy", [str(bins / "kube-proxy"), f"--config={config}", "--v=2"])

    def node(self) -> dict[str, Any] | None:
        return self.admin.get("v1", "Node", NODE_NAME)

    def node_ready(self) -> bool:
        node = self.node() or {}
        conds = (node.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def wait_node_ready(self, timeout_s: float = NODE_READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.node_ready():
            for name in ("containerd", "kubelet", "kube-proxy"):
                proc = self.procs.get(name)
                if proc is not None and not proc.alive():
                    raise NodeStackError(f"{name} exited:\n{proc.output()[-4000:]}")
            if time.monotonic() > deadline:
                kubelet = self.procs["kubelet"].output()
                raise NodeStackError(
                    f"node {NODE_NAME} not Ready in {timeout_s}s: {self.node()!r:.2000}\n"
                    f"kubelet log tail:\n{kubelet[-4000:]}"
                )
            time.sleep(0.5)

    def import_image(self, ref: str) -> None:
        """A podman image (localhost/stunner-*) into the node's containerd."""
        import_podman_image(self.socket, ref, self.workdir)

    def tag_image(self, ref: str, new_ref: str) -> None:
        """Another name for an image already in the node's containerd (a "new" tag)."""
        subprocess.run(
            [
                "ctr",
                "-a",
                str(self.socket),
                "-n",
                "k8s.io",
                "images",
                "tag",
                "--force",
                ref,
                new_ref,
            ],
            capture_output=True,
            check=True,
            timeout=60,
        )

    def container_pid(self, container_id: str) -> int:
        """The host PID of a running container (``containerd://ID`` from a pod's status)."""
        cid = container_id.removeprefix("containerd://")
        listing = subprocess.run(
            ["ctr", "-a", str(self.socket), "-n", "k8s.io", "tasks", "ls"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for line in listing.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == cid:
                return int(fields[1])
        raise NodeStackError(f"no running task {cid} in the node's containerd")

    def log(self, name: str) -> str:
        proc = self.procs.get(name)
        return proc.output() if proc else ""

    # -- stop

    def stop(self) -> dict[str, Any]:
        """Take everything down (see ``teardown``); returns what it had to clean up."""
        if self.cluster._admin is not None:
            self.cluster._admin.close()
            self.cluster._admin = None
        report = teardown(self.workdir)
        for proc in self.procs.values():
            proc.stop(timeout_s=1.0)  # already gone: reaps the child and closes its log
        self.procs.clear()
        self.cluster.etcd = self.cluster.apiserver = self.cluster.controller_manager = None
        return report


def _wait_https_ok(proc: ServerProcess, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if not proc.alive():
            raise NodeStackError(f"{proc.argv[0]} exited:\n{proc.output()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, verify=False, timeout=2.0).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise NodeStackError(f"{url} not ok in {timeout_s}s:\n{proc.output()[-3000:]}")
        time.sleep(0.25)


# -- teardown, from the state file alone (make node-down runs it in another process)


def _stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _delete_all_pods(state: dict[str, Any], socket: Path) -> None:
    """Force-delete every pod, then wait for the kubelet to stop their sandboxes (which runs
    CNI DEL and removes their network namespaces), while it is still running."""
    if not state.get("server") or not state.get("admin"):
        return
    client = KubeClient(
        state["server"], Path(state["ca"]), client_cert=tuple(state["admin"]), timeout_s=5.0
    )
    try:
        for ns in client.list("v1", "Namespace"):
            client.request(
                "DELETE",
                f"/api/v1/namespaces/{ns['metadata']['name']}/pods",
                params={"gracePeriodSeconds": "0"},
            )
    except (httpx.HTTPError, KubeError):
        return
    finally:
        client.close()
    deadline = time.monotonic() + TEARDOWN_TIMEOUT_S / 2
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["ctr", "-a", str(socket), "-n", "k8s.io", "tasks", "ls", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not done.stdout.strip():
            return
        time.sleep(0.5)


def teardown(workdir: Path) -> dict[str, Any]:
    """Stop every process the stack started (by PID) and undo what it changed on the host.

    Every step runs even when one before it failed (a step that stops half-way must not leave
    the API server, containerd and their mounts to the next run); the failures are raised
    together at the end, as `TeardownError`.
    """
    state_file = workdir / "node-state.json"
    if not state_file.exists():
        return {}
    state = json.loads(state_file.read_text())
    pids: dict[str, int] = state.get("pids", {})
    socket = Path(state["socket"])
    report: dict[str, Any] = {}
    failed: list[str] = []

    def step(name: str, action: Callable[[], Any], *, keep: bool = True) -> Any:
        """Run one step; its result goes into the report under `name` when `keep`."""
        try:
            result = action()
        except Exception as exc:  # every step must run; all are raised below
            failed.append(f"{name}: {exc!r}")
            return None
        if keep:
            report[name] = result
        return result

    for name in ("kube-scheduler", "kube-controller-manager"):
        if name in pids:
            step(f"stop {name}", partial(_stop_pid, pids[name]), keep=False)
    if "kubelet" in pids and "kube-apiserver" in pids:
        step("delete pods", partial(_delete_all_pods, state, socket), keep=False)
    for name in ("kube-proxy", "kubelet", "coredns"):
        if name in pids:
            step(f"stop {name}", partial(_stop_pid, pids[name]), keep=False)
    if state.get("kube-proxy"):
        step(
            "kube-proxy cleanup",
            partial(
                subprocess.run,
                [state["kube-proxy"], "--cleanup", "--proxy-mode=iptables"],
                capture_output=True,
                check=False,
                timeout=60,
            ),
            keep=False,
        )
    snapshot = HostSnapshot.from_json(state["snapshot"]) if state.get("snapshot") else None
    # Containers the kubelet did not get to stop, and their shims, by PID; then containerd.
    if snapshot is not None:
        step("killed-container-processes", snapshot.kill_cgroup_processes)
    # read while containerd may be gone already
    cached: dict[str, str] = (
        step("cni sandboxes", partial(cni_sandboxes, CNI_NETWORK), keep=False) or {}
    )
    in_sandboxes = step("sandbox netns", partial(sandbox_netns, socket), keep=False) or []
    netns = sorted({*in_sandboxes, *cached.values()})
    shims: list[int] = step("shim pids", partial(shim_pids, socket), keep=False) or []
    for pid in shims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    report["killed-shims"] = shims
    for name in ("containerd", "kube-apiserver", "etcd"):
        if name in pids:
            step(f"stop {name}", partial(_stop_pid, pids[name]), keep=False)
    step("unmounted", partial(unmount_under, workdir))
    if snapshot is not None:
        step("netns-removed", partial(snapshot.remove_netns, netns))
        step("cgroups-stuck", snapshot.remove_cgroups)
        step("chains-removed", snapshot.remove_chains)
        step("nft-tables-removed", snapshot.remove_nft_tables)
    report["bridge-removed"] = bool(state.get("bridge")) and bool(
        step("delete bridge", partial(delete_bridge, BRIDGE), keep=False)
    )
    if snapshot is not None:
        step("sysctls-restored", snapshot.restore_sysctls)
    step(
        "cni-results-removed",
        partial(remove_cni_state, snapshot, CNI_NETWORK, list(cached)),
    )
    state_file.unlink()
    if failed:
        raise TeardownError("node teardown: " + "; ".join(failed))
    return report


class TeardownError(RuntimeError):
    """Steps of the node's teardown that failed (every other step ran)."""


# -- make node-up / node-down


def _up(state: Path) -> int:
    if (state / "node-state.json").exists():
        print(f"a one-node cluster is already up (state in {state}); run make node-down first")
        return 1
    if state.exists():
        shutil.rmtree(state)
    started = time.monotonic()
    stack = NodeStack(state)
    try:
        stack.start()
    except Exception as err:
        print(f"node-up failed: {err}", file=sys.stderr)
        stack.stop()
        return 1
    print(f"KUBECONFIG={stack.cluster.admin_kubeconfig}")
    print(f"CONTAINERD_ADDRESS={stack.socket}")
    print(f"# steps {stack.timings}")
    print(f"# up in {time.monotonic() - started:.0f}s; logs in {state}; stop with make node-down")
    return 0


def _down(state: Path) -> int:
    if not (state / "node-state.json").exists():
        print("no one-node cluster is up")
        return 0
    report = teardown(state)
    print(f"one-node cluster stopped: {json.dumps(report)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node_stack", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state", type=Path, default=Path(".run/node"))
    args = parser.parse_args(argv)
    state = args.state.resolve()
    return _up(state) if args.action == "up" else _down(state)


if __name__ == "__main__":
    raise SystemExit(main())
