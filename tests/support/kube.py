"""A real Kubernetes control plane without nodes, for the integration tier.

``KubeCluster`` starts an embedded etcd, a kube-apiserver and a kube-controller-manager, all
built from the published Kubernetes modules (tests/kube, see support.gobin) and bound to
127.0.0.1 on free ports. The API server runs with RBAC, service-account token signing, the
default admission plugins, an audit log and a short etcd compaction interval and request
timeout, so that authorization refusals, schema rejections, garbage collection and ``410 Gone``
all really happen (``watch_cache=False`` sends watches to etcd, so a watch resumed from a
compacted resource version gets 410 as soon as the compaction has passed it). No kubelet,
scheduler or container runtime: pods never run by themselves
(support.kubelet plays the kubelet's part for the pods a test needs).

``KubeClient`` is a small synchronous REST client (httpx) that any test can use as the admin
or as a service account: discovery, server-side apply of any object, get, list, delete, status
patches and TokenRequest.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from support import gobin
from support.kube_pki import ClusterPki, make_pki
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess

SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
FIELD_MANAGER = "stunner-tests"

# Every request's metadata, with the user, verb and resource: what the RBAC test reads.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
"""


class KubeError(RuntimeError):
    """An API call answered with an error status; ``status`` and ``body`` say which."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:500]
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.body = body


@dataclass(frozen=True, slots=True)
class ApiResource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def base(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        ns = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        tail = f"/{name}" if name else ""
        return f"{self.base}{ns}/{self.plural}{tail}"


@dataclass
class KubeClient:
    """Synchronous REST calls to the API server, as one user (client cert or bearer token)."""

    server: str
    ca_cert: Path
    client_cert: tuple[Path, Path] | None = None
    token: str | None = None
    timeout_s: float = 15.0
    _http: httpx.Client = field(init=False, repr=False)
    _resources: dict[tuple[str, str], ApiResource] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if self.client_cert:
            context.load_cert_chain(str(self.client_cert[0]), str(self.client_cert[1]))
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(
            base_url=self.server, verify=context, headers=headers, timeout=self.timeout_s
        )

    def close(self) -> None:
        self._http.close()

    # -- raw calls

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        ok: Iterable[int] = (),
    ) -> Any:
        content = None
        headers = {}
        if body is not None:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        response = self._http.request(method, path, content=content, headers=headers, params=params)
        try:
            data: Any = response.json()
        except ValueError:
            data = response.text
        if response.status_code >= 400 and response.status_code not in set(ok):
            raise KubeError(method, path, response.status_code, data)
        return data

    # -- discovery

    def resource(self, api_version: str, kind: str) -> ApiResource:
        """The REST resource of a kind (from the server's discovery documents)."""
        key = (api_version, kind)
        if key not in self._resources:
            group, _, version = api_version.rpartition("/")
            base = f"/apis/{api_version}" if group else f"/api/{version}"
            listing = self.request("GET", base)
            for r in listing.get("resources", []):
                if "/" in r["name"]:
                    continue
                self._resources[(api_version, r["kind"])] = ApiResource(
                    group, version, r["name"], r["kind"], r["namespaced"]
                )
        try:
            return self._resources[key]
        except KeyError:
            raise KubeError("GET", api_version, 404, f"the server serves no {kind}") from None

    def forget_discovery(self) -> None:
        self._resources.clear()

    # -- objects

    def apply(self, obj: Mapping[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        """Server-side apply of one object (any kind the server serves)."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        ns = obj.get("metadata", {}).get("namespace") or namespace
        if res.namespaced and not ns:
            ns = "default"
        body = dict(obj)
        if res.namespaced:
            body["metadata"] = {**obj["metadata"], "namespace": ns}
        path = res.path(ns, obj["metadata"]["name"])
        result: dict[str, Any] = self.request(
            "PATCH",
            path,
            body=body,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        return result

    def replace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """An update (PUT) of an existing object, unconditional when it names no
        resourceVersion: what Kubernetes' own controllers send, and far less work for the API
        server than a server-side apply of the same object."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        ns = obj.get("metadata", {}).get("namespace") if res.namespaced else None
        result: dict[str, Any] = self.request(
            "PUT",
            res.path(ns, obj["metadata"]["name"]),
            body=obj,
            params={"fieldManager": FIELD_MANAGER},
        )
        return result

    def apply_all(
        self, docs: Iterable[Mapping[str, Any]], *, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        return [self.apply(d, namespace=namespace) for d in docs]

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        res = self.resource(api_version, kind)
        data = self.request("GET", res.path(namespace, name), ok=(404,))
        if isinstance(data, dict) and data.get("kind") == "Status" and data.get("code") == 404:
            return None
        return data if isinstance(data, dict) else None

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        res = self.resource(api_version, kind)
        params = {"labelSelector": label_selector} if label_selector else None
        data = self.request("GET", res.path(namespace), params=params)
        items: list[dict[str, Any]] = data.get("items", [])
        return items

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
    ) -> bool:
        res = self.resource(api_version, kind)
        data = self.request(
            "DELETE",
            res.path(namespace, name),
            body={"propagationPolicy": propagation},
            ok=(404,),
        )
        return not (isinstance(data, dict) and data.get("code") == 404)

    def patch_status(
        self, api_version: str, kind: str, name: str, namespace: str | None, status: Any
    ) -> dict[str, Any]:
        res = self.resource(api_version, kind)
        result: dict[str, Any] = self.request(
            "PATCH",
            res.path(namespace, name) + "/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )
        return result

    def service_account_token(self, namespace: str, name: str, *, expiration_s: int = 3600) -> str:
        """A bound token of a ServiceAccount from the TokenRequest API."""
        data = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_s},
            },
        )
        return str(data["status"]["token"])

    def wait_for(
        self,
        what: str,
        probe: Callable[[], Any],
        *,
        timeout_s: float = 30.0,
        interval_s: float = 0.2,
    ) -> Any:
        """Poll ``probe`` until it returns a truthy value; fail naming ``what``."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = probe()
            except KubeError as err:
                last = err
            else:
                if last:
                    return last
            time.sleep(interval_s)
        raise TimeoutError(f"{what}: not reached in {timeout_s}s (last: {last!r})")

    def wait_established(self, crd_names: Iterable[str], timeout_s: float = 30.0) -> None:
        for name in crd_names:

            def established(n: str = name) -> bool:
                crd = self.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", n)
                conds = ((crd or {}).get("status") or {}).get("conditions") or []
                return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

            self.wait_for(f"CRD {name} established", established, timeout_s=timeout_s)
        self.forget_discovery()


def write_kubeconfig(
    path: Path,
    server: str,
    ca_cert: Path,
    *,
    user: str,
    token: str | None = None,
    client_cert: tuple[Path, Path] | None = None,
    namespace: str = "default",
) -> Path:
    creds: dict[str, Any] = {}
    if token is not None:
        creds["token"] = token
    if client_cert is not None:
        creds["client-certificate"] = str(client_cert[0])
        creds["client-key"] = str(client_cert[1])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "stunner-test",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [
            {
                "name": "stunner-test",
                "context": {"cluster": "stunner-test", "user": user, "namespace": namespace},
            }
        ],
        "current-context": "stunner-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class KubeCluster:
    """etcd, kube-apiserver and kube-controller-manager in ``workdir``, all on loopback."""

    def __init__(
        self,
        workdir: Path,
        *,
        compaction_interval_s: int = 5,
        min_request_timeout_s: int = 30,
        controllers: str = "*",
        watch_cache: bool = True,
        apiserver_args: Sequence[str] = (),
        host: str = LOOPBACK,
        endpoint_reconciler: str = "none",
        pki: Callable[[Path], ClusterPki] = make_pki,
    ) -> None:
        self.workdir = workdir
        self.host = host
        """The API server's bind and advertise address (the real node: the node IP, so pods
        reach it through the ``kubernetes`` Service)."""
        self.endpoint_reconciler = endpoint_reconciler
        """``none`` leaves the ``kubernetes`` Service without endpoints; ``lease`` points it
        at ``host``."""
        self._make_pki = pki
        self.apiserver_args = list(apiserver_args)
        """More kube-apiserver flags (e.g. ``--kubelet-preferred-address-types``)."""
        self.compaction_interval_s = compaction_interval_s
        self.min_request_timeout_s = min_request_timeout_s
        self.controllers = controllers
        self.watch_cache = watch_cache
        self.pki: ClusterPki | None = None
        self.etcd: ServerProcess | None = None
        self.apiserver: ServerProcess | None = None
        self.controller_manager: ServerProcess | None = None
        self.port = 0
        self.etcd_port = 0
        self.admin_kubeconfig = workdir / "admin.kubeconfig"
        self.audit_log = workdir / "audit.log"
        self._admin: KubeClient | None = None
        self.apiserver_ready_at: list[float] = []
        """When each API server start became ready (time.time())."""

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def admin(self) -> KubeClient:
        if self._admin is None:
            assert self.pki is not None, "the cluster is not started"
            self._admin = KubeClient(
                self.server, self.pki.ca_cert, client_cert=(self.pki.admin_cert, self.pki.admin_key)
            )
        return self._admin

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount (a TokenRequest token)."""
        assert self.pki is not None
        token = self.admin.service_account_token(namespace, name)
        return write_kubeconfig(
            path,
            self.server,
            self.pki.ca_cert,
            user=f"system:serviceaccount:{namespace}:{name}",
            token=token,
            namespace=namespace,
        )

    # -- processes

    def start(self) -> KubeCluster:
        bins = gobin.kube_binaries()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = self._make_pki(self.workdir / "pki")
        self._start_etcd(bins)
        self.start_apiserver(bins)
        write_kubeconfig(
            self.admin_kubeconfig,
            self.server,
            self.pki.ca_cert,
            user="kubernetes-admin",
            client_cert=(self.pki.admin_cert, self.pki.admin_key),
        )
        self._start_controller_manager(bins)
        return self

    def _start_etcd(self, bins: Path) -> None:
        self.etcd_port = self.etcd_port or free_port()
        peer = free_port()
        self.etcd = ServerProcess(
            [
                str(bins / "etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-url=http://{LOOPBACK}:{self.etcd_port}",
                f"--listen-peer-url=http://{LOOPBACK}:{peer}",
            ],
            log_path=self.workdir / "etcd.log",
        )
        _wait_for_line(self.etcd, "ETCD_READY", 60.0)

    def start_apiserver(self, bins: Path | None = None) -> None:
        """(Re)start the API server on the same port and storage."""
        bins = bins or gobin.kube_binaries()
        assert self.pki is not None
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        self.port = self.port or free_port(host=self.host)
        self.apiserver = ServerProcess(
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers=http://{LOOPBACK}:{self.etcd_port}",
                f"--bind-address={self.host}",
                *([f"--advertise-address={self.host}"] if self.host != LOOPBACK else []),
                f"--secure-port={self.port}",
                f"--endpoint-reconciler-type={self.endpoint_reconciler}",
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--client-ca-file={self.pki.ca_cert}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={self.pki.sa_pub}",
                f"--service-account-signing-key-file={self.pki.sa_key}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--etcd-compaction-interval={self.compaction_interval_s}s",
                f"--min-request-timeout={self.min_request_timeout_s}",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                f"--watch-cache={str(self.watch_cache).lower()}",
                "--profiling=false",
                "--v=1",
                *self.apiserver_args,
            ],
            log_path=self.workdir / "kube-apiserver.log",
        )
        probe = KubeClient(
            self.server,
            self.pki.ca_cert,
            client_cert=(self.pki.admin_cert, self.pki.admin_key),
            timeout_s=2.0,
        )
        try:
            deadline = time.monotonic() + 120.0
            while True:
                if not self.apiserver.alive():
                    raise RuntimeError(f"kube-apiserver exited:\n{self.apiserver.output()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError, KubeError):
                    if probe.request("GET", "/readyz") == "ok":
                        self.apiserver_ready_at.append(time.time())
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"kube-apiserver not ready:\n{self.apiserver.output()[-3000:]}"
                    )
                time.sleep(0.25)
        finally:
            probe.close()
        if self._admin is not None:
            self._admin.forget_discovery()

    def stop_apiserver(self) -> None:
        if self.apiserver is not None:
            self.apiserver.stop()
            self.apiserver = None

    def _start_controller_manager(self, bins: Path) -> None:
        assert self.pki is not None
        self.controller_manager = ServerProcess(
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--authentication-kubeconfig={self.admin_kubeconfig}",
                f"--authorization-kubeconfig={self.admin_kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                f"--controllers={self.controllers}",
                "--use-service-account-credentials=false",
                f"--root-ca-file={self.pki.ca_cert}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--concurrent-gc-syncs=5",
                "--v=1",
                # the DaemonSet controller's decisions (which pod is available, which is deleted)
                "--vmodule=daemon_controller=4,update=5",
            ],
            log_path=self.workdir / "kube-controller-manager.log",
        )

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        for proc in (self.controller_manager, self.apiserver, self.etcd):
            if proc is not None:
                proc.stop()
        self.controller_manager = self.apiserver = self.etcd = None

    # -- audit

    def audit_events(self) -> list[dict[str, Any]]:
        if not self.audit_log.exists():
            return []
        events = []
        for line in self.audit_log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events


def _wait_for_line(proc: ServerProcess, marker: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in proc.output().splitlines():
            if line.startswith(marker):
                return line
        if not proc.alive():
            raise RuntimeError(f"{proc.argv[0]} exited:\n{proc.output()[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"{proc.argv[0]}: no {marker!r} in {timeout_s}s:\n{proc.output()[-3000:]}")
