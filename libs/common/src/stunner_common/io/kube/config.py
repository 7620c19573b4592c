"""Read a kubeconfig as kubectl does: which file and context, which API server and credentials.

turncat, stunnerctl and stunnerd (``-c k8s``) on a laptop reach the cluster with the user's
kubeconfig (``--kubeconfig``, else ``KUBECONFIG``, a path list merged first-wins, else
``~/.kube/config``; ``--context``). The credentials may be a bearer token (``token``,
``tokenFile``), a client certificate (``client-certificate[-data]``/``client-key[-data]``), or a
client-go credential plugin (``exec``: the command the cloud providers' kubeconfigs name, e.g.
``gke-gcloud-auth-plugin``, ``aws eks get-token``, ``kubelogin``), run as client-go runs it:
``KUBERNETES_EXEC_INFO`` describes the request, the plugin prints an ``ExecCredential`` whose
``status`` holds a token or a client certificate. The long-removed ``auth-provider`` section is
refused with what to use instead.

A process that runs in a pod (the operator) uses its service account instead:
:func:`in_cluster_access` (``KUBERNETES_SERVICE_HOST``/``_PORT``, the token and CA that the
kubelet mounts; the token is read again at every request, as the kubelet rotates it).

Every failure is a :class:`KubeDiscoveryError` with one line for the user.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stunner_common.cli import CDS_ADDR_ENV, DEPRECATED_CDS_ADDR_ENVS

__all__ = [
    "EXEC_TIMEOUT_S",
    "SERVICE_ACCOUNT_DIR",
    "KubeAccess",
    "KubeDiscoveryError",
    "KubeOptions",
    "in_cluster_access",
    "kubeconfig_paths",
    "load_kubeconfig",
    "wants_kube_discovery",
]

EXEC_TIMEOUT_S = 60.0
"""How long a credential plugin may run (a plugin that opens a browser login is not waited for
longer: tools here are not interactive)."""
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts a pod's service-account token, CA bundle and namespace."""
EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
)


class KubeDiscoveryError(RuntimeError):
    """The CDS (or a pod) could not be found or reached through the Kubernetes API (one line).

    ``reason`` says which kind of failure for the caller's exit status: ``kubeconfig`` (none,
    or unusable), ``forbidden`` (the API server refused the credentials or the request),
    ``unreachable`` (no API server answered) or ``lookup`` (no usable pod).
    """

    def __init__(self, message: str, reason: str = "lookup") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """kubectl's flags: ``--kubeconfig``, ``--context``; ``namespace`` is where the CDS runs
    (None: search every namespace)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


@dataclass
class KubeAccess:
    """One API server and the credentials the kubeconfig gives for it."""

    server: str
    ssl_context: ssl.SSLContext
    token: str | None = None
    namespace: str = "default"
    context: str = ""
    token_file: str | None = None
    """A token file read again at every request (a pod's rotated service-account token); the
    last token read stays in use while the file cannot be read."""

    @property
    def headers(self) -> dict[str, str]:
        if self.token_file:
            with contextlib.suppress(OSError):
                self.token = Path(self.token_file).read_text().strip() or self.token
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def _config_error(message: str) -> KubeDiscoveryError:
    return KubeDiscoveryError(message, "kubeconfig")


def kubeconfig_paths(env: Mapping[str, str], flag: str | None = None) -> list[Path]:
    """Where the kubeconfig is: the flag, else ``KUBECONFIG`` (a path list), else
    ``~/.kube/config``; empty when none of them names a file that exists."""
    if flag:
        return [Path(flag).expanduser()]
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p.strip()]
    if listed:
        return [Path(p).expanduser() for p in listed if Path(p).expanduser().is_file()]
    home = env.get("HOME") or str(Path.home())
    default = Path(home) / ".kube" / "config"
    return [default] if default.is_file() else []


def wants_kube_discovery(
    env: Mapping[str, str], address_flag: str | None, options: KubeOptions
) -> bool:
    """Whether a tool finds the CDS through the kubeconfig: only when no CDS address is given
    (flag, ``CDS_SERVER_ADDR`` or an older name) and a kubeconfig is (``--kubeconfig``,
    ``--context``, ``KUBECONFIG`` or an existing ``~/.kube/config``). Otherwise the tool keeps
    its address or the loopback default of ``make run``."""
    if address_flag and address_flag.strip():
        return False
    if any(env.get(name, "").strip() for name in (CDS_ADDR_ENV, *DEPRECATED_CDS_ADDR_ENVS)):
        return False
    if options.kubeconfig or options.context or env.get("KUBECONFIG", "").strip():
        return True
    return bool(kubeconfig_paths(env))


def _merged(paths: list[Path]) -> tuple[dict[str, Any], dict[str, Path]]:
    """Merge kubeconfig files as kubectl does (the first file to name a thing wins); also the
    folder each named cluster/user came from, for relative file paths."""
    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": ""}
    origin: dict[str, Path] = {}
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise _config_error(f"cannot read kubeconfig {path}: {exc.strerror}") from None
        except yaml.YAMLError:
            raise _config_error(f"kubeconfig {path} is not valid YAML") from None
        if not isinstance(doc, dict):
            raise _config_error(f"kubeconfig {path} is not a kubeconfig")
        for section, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for entry in doc.get(section) or []:
                name = str(entry.get("name", ""))
                if name and name not in merged[section]:
                    merged[section][name] = entry.get(key) or {}
                    origin[f"{section}/{name}"] = path.parent
        if not merged["current-context"] and doc.get("current-context"):
            merged["current-context"] = str(doc["current-context"])
    return merged, origin


def _material(entry: Mapping[str, Any], key: str, base: Path, tmp: list[str]) -> str | None:
    """A file path for ``key`` (relative to the kubeconfig) or for ``key-data`` (written to a
    private temporary file that the caller removes)."""
    data = entry.get(f"{key}-data")
    if data:
        return _private_file(base64.b64decode(data), tmp)
    path = entry.get(key)
    if not path:
        return None
    resolved = Path(path).expanduser()
    return str(resolved if resolved.is_absolute() else base / resolved)


def _private_file(data: bytes, tmp: list[str]) -> str:
    fd, name = tempfile.mkstemp(prefix="kube-", suffix=".pem")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.append(name)
    return name


@dataclass(frozen=True, slots=True)
class _Context:
    """The chosen context's parts, with the folders their relative paths start from."""

    name: str
    cluster: Mapping[str, Any]
    user: Mapping[str, Any]
    namespace: str
    cluster_base: Path
    user_base: Path


def _choose_context(options: KubeOptions, env: Mapping[str, str]) -> _Context:
    paths = kubeconfig_paths(env, options.kubeconfig)
    if options.kubeconfig and not paths[0].is_file():
        raise _config_error(f"no kubeconfig: {options.kubeconfig} does not exist")
    if not paths:
        where = f"KUBECONFIG={env['KUBECONFIG']}" if env.get("KUBECONFIG") else "~/.kube/config"
        raise _config_error(
            f"no kubeconfig ({where} names no file): pass --kubeconfig, or the CDS address "
            "with --cds-server-address"
        )
    merged, origin = _merged(paths)
    name = options.context or merged["current-context"]
    if not name:
        raise _config_error("the kubeconfig has no current context: pass --context")
    context = merged["contexts"].get(name)
    if context is None:
        raise _config_error(f"the kubeconfig has no context {name!r}")
    cluster = merged["clusters"].get(context.get("cluster", ""))
    if not cluster or not cluster.get("server"):
        raise _config_error(f"context {name!r}: its cluster has no server")
    user_name = context.get("user", "")
    return _Context(
        name=name,
        cluster=cluster,
        user=merged["users"].get(user_name) or {},
        namespace=str(context.get("namespace") or "default"),
        cluster_base=origin.get(f"clusters/{context.get('cluster', '')}", Path.cwd()),
        user_base=origin.get(f"users/{user_name}", Path.cwd()),
    )


def _exec_command(spec: Mapping[str, Any], base: Path) -> list[str]:
    command = str(spec.get("command") or "")
    if not command:
        raise _config_error("its exec credential plugin names no command")
    # client-go: a relative path with a separator is relative to the kubeconfig's folder.
    if os.sep in command and not Path(command).is_absolute():
        command = str(base / command)
    return [command, *(str(a) for a in spec.get("args") or [])]


def _exec_environment(
    spec: Mapping[str, Any], env: Mapping[str, str], cluster: Mapping[str, Any]
) -> dict[str, str]:
    """The plugin's environment: ours, its ``env`` entries, and ``KUBERNETES_EXEC_INFO``."""
    api_version = str(spec.get("apiVersion") or "")
    request: dict[str, Any] = {"interactive": False}
    if spec.get("provideClusterInfo"):
        info = {"server": cluster.get("server")}
        if cluster.get("certificate-authority-data"):
            info["certificate-authority-data"] = cluster["certificate-authority-data"]
        if cluster.get("insecure-skip-tls-verify"):
            info["insecure-skip-tls-verify"] = True
        request["cluster"] = info
    merged = dict(env)
    for item in spec.get("env") or []:
        if isinstance(item, Mapping) and item.get("name"):
            merged[str(item["name"])] = str(item.get("value", ""))
    merged["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": api_version, "kind": "ExecCredential", "spec": request}
    )
    return merged


def _exec_not_found(spec: Mapping[str, Any], argv: list[str]) -> KubeDiscoveryError:
    hint = str(spec.get("installHint") or "").strip().replace("\n", " ")
    return _config_error(
        f"its exec credential plugin {argv[0]!r} was not found" + (f": {hint}" if hint else "")
    )


def _run_exec_plugin(
    spec: Mapping[str, Any], env: Mapping[str, str], cluster: Mapping[str, Any], base: Path
) -> dict[str, Any]:
    """Run a client-go credential plugin; its ExecCredential's ``status``."""
    api_version = str(spec.get("apiVersion") or "")
    if api_version not in EXEC_API_VERSIONS:
        raise _config_error(
            f"its exec credential plugin asks for apiVersion {api_version or '(none)'!r}; "
            f"supported: {', '.join(EXEC_API_VERSIONS)}"
        )
    argv = _exec_command(spec, base)
    if shutil.which(argv[0], path=env.get("PATH")) is None and not Path(argv[0]).is_file():
        raise _exec_not_found(spec, argv)
    try:
        done = subprocess.run(
            argv,
            env=_exec_environment(spec, env, cluster),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=EXEC_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise _exec_not_found(spec, argv) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _config_error(f"its exec credential plugin {argv[0]!r} failed: {exc}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        tail = f": {said[-1]}" if said else ""
        raise _config_error(
            f"its exec credential plugin {argv[0]!r} exited with status {done.returncode}{tail}"
        )
    try:
        credential = json.loads(done.stdout)
        status = credential["status"]
        if not isinstance(status, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise _config_error(
            f"its exec credential plugin {argv[0]!r} did not print an ExecCredential with a status"
        ) from None
    return status


@dataclass
class _Credentials:
    token: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def _credentials(ctx: _Context, env: Mapping[str, str], tmp: list[str]) -> _Credentials:
    """The user section's credentials: an exec plugin's, or a token and client certificate."""
    user = ctx.user
    if user.get("auth-provider"):
        name = (user.get("auth-provider") or {}).get("name", "")
        raise _config_error(
            f"context {ctx.name!r}: the {name or 'auth-provider'} auth-provider was removed from "
            "Kubernetes clients; use its exec credential plugin (see your provider's docs)"
        )
    if user.get("exec"):
        try:
            status = _run_exec_plugin(user["exec"], env, ctx.cluster, ctx.user_base)
        except KubeDiscoveryError as exc:
            raise _config_error(f"context {ctx.name!r}: {exc}") from None
        creds = _Credentials(token=str(status.get("token") or "") or None)
        if status.get("clientCertificateData") and status.get("clientKeyData"):
            creds.cert_file = _private_file(str(status["clientCertificateData"]).encode(), tmp)
            creds.key_file = _private_file(str(status["clientKeyData"]).encode(), tmp)
        if creds.token is None and creds.cert_file is None:
            raise _config_error(
                f"context {ctx.name!r}: its exec credential plugin gave neither a token "
                "nor a client certificate"
            )
        return creds
    token = user.get("token")
    if not token and user.get("tokenFile"):
        try:
            token = Path(user["tokenFile"]).read_text().strip()
        except OSError as exc:
            raise _config_error(f"cannot read tokenFile: {exc.strerror}") from None
    return _Credentials(
        token=str(token) if token else None,
        cert_file=_material(user, "client-certificate", ctx.user_base, tmp),
        key_file=_material(user, "client-key", ctx.user_base, tmp),
    )


def _ssl_context(ctx: _Context, creds: _Credentials, tmp: list[str]) -> ssl.SSLContext:
    cluster = ctx.cluster
    try:
        context = ssl.create_default_context(
            cafile=_material(cluster, "certificate-authority", ctx.cluster_base, tmp)
        )
        if cluster.get("insecure-skip-tls-verify"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif cluster.get("tls-server-name"):
            context.check_hostname = True
        if creds.cert_file and creds.key_file:
            context.load_cert_chain(creds.cert_file, creds.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise _config_error(f"context {ctx.name!r}: cannot load its certificates: {exc}") from None
    return context


def load_kubeconfig(options: KubeOptions, env: Mapping[str, str]) -> KubeAccess:
    """The API server, TLS settings and credentials of the chosen context."""
    ctx = _choose_context(options, env)
    tmp: list[str] = []
    try:
        creds = _credentials(ctx, env, tmp)
        ssl_context = _ssl_context(ctx, creds, tmp)
    finally:
        for name in tmp:
            with contextlib.suppress(OSError):
                os.unlink(name)
    return KubeAccess(
        server=str(ctx.cluster["server"]).rstrip("/"),
        ssl_context=ssl_context,
        token=creds.token,
        namespace=ctx.namespace,
        context=ctx.name,
    )


def in_cluster_access(
    env: Mapping[str, str], account_dir: Path = SERVICE_ACCOUNT_DIR
) -> KubeAccess:
    """The API server as a pod sees it: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the pod's
    service-account token (read again at every request) and the cluster's CA."""
    host = env.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = env.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        raise _config_error("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token_file = account_dir / "token"
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise _config_error(
            f"cannot read the service-account token {token_file}: {exc.strerror}"
        ) from None
    if not token:
        raise _config_error(f"the service-account token {token_file} is empty")
    try:
        ssl_context = ssl.create_default_context(cafile=str(account_dir / "ca.crt"))
    except (OSError, ssl.SSLError) as exc:
        raise _config_error(
            f"cannot load the cluster's CA {account_dir / 'ca.crt'}: {exc}"
        ) from None
    try:
        namespace = (account_dir / "namespace").read_text().strip() or "default"
    except OSError:
        namespace = "default"
    server_host = f"[{host}]" if ":" in host else host
    return KubeAccess(
        server=f"https://{server_host}:{port}",
        ssl_context=ssl_context,
        token=token,
        namespace=namespace,
        context="in-cluster",
        token_file=str(token_file),
    )
