"""Find the CDS through the Kubernetes API from a kubeconfig, as upstream's tools do.

turncat (``k8s://`` URIs), stunnerctl and stunnerd (``-c k8s``) on a laptop have a kubeconfig,
not a CDS address. :func:`open_cds_forward` loads the kubeconfig (``--kubeconfig``, else
``KUBECONFIG``, else ``~/.kube/config``; ``--context``), lists the pods labelled
``stunner.l7mp.io/config-discovery-service=enabled`` (in one namespace, else in all), picks a
ready one and forwards ``127.0.0.1:<free port>`` to its CDS port through the API server, as
``kubectl port-forward`` does: one WebSocket per forwarded TCP connection to
``/api/v1/namespaces/NS/pods/POD/portforward?ports=PORT``, subprotocol ``v4.channel.k8s.io``
(the kubelet's channel protocol: each message starts with its channel byte, 0 data and 1
error; the first message on each channel is the port, 2 bytes little-endian). A connection
whose WebSocket cannot be opened makes the next one look the pod up again, so the forward
outlives a restarted CDS pod; it closes with the context.

The CDS bearer token comes from the Secret the chart makes (``stunner-cds-token``, key
``token``, beside the CDS pod) when the user may read it, else from the caller's fallback
(``CDS_TOKEN``). Every failure is a :class:`KubeDiscoveryError` with one line for the user.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import yaml
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.typing import Subprotocol

from stunner_common.cli import CDS_ADDR_ENV, DEPRECATED_CDS_ADDR_ENVS

__all__ = [
    "CDS_LABEL",
    "CDS_SERVICE",
    "CDS_TOKEN_KEY",
    "CDS_TOKEN_SECRET",
    "CdsForward",
    "KubeAccess",
    "KubeDiscoveryError",
    "KubeOptions",
    "kubeconfig_paths",
    "load_kubeconfig",
    "open_cds_forward",
    "wants_kube_discovery",
]

log = logging.getLogger(__name__)

CDS_LABEL = "stunner.l7mp.io/config-discovery-service=enabled"
CDS_SERVICE = "stunner-config-discovery"
CDS_TOKEN_SECRET = "stunner-cds-token"
CDS_TOKEN_KEY = "token"
DEFAULT_CDS_PORT = 13478
PORTFORWARD_PROTOCOL = "v4.channel.k8s.io"
DATA_CHANNEL = 0
ERROR_CHANNEL = 1
LINGER_S = 5.0
"""How long a connection's answer may still come after the local side stopped sending."""


class KubeDiscoveryError(RuntimeError):
    """The CDS could not be found or reached through the Kubernetes API (one line).

    ``reason`` says which kind of failure for the caller's exit status: ``kubeconfig`` (none,
    or unusable), ``forbidden`` (the API server refused the credentials or the request),
    ``unreachable`` (no API server answered) or ``lookup`` (no usable CDS pod).
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

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


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
            raise KubeDiscoveryError(
                f"cannot read kubeconfig {path}: {exc.strerror}", "kubeconfig"
            ) from None
        except yaml.YAMLError:
            raise KubeDiscoveryError(f"kubeconfig {path} is not valid YAML", "kubeconfig") from None
        if not isinstance(doc, dict):
            raise KubeDiscoveryError(f"kubeconfig {path} is not a kubeconfig", "kubeconfig")
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
        fd, name = tempfile.mkstemp(prefix="kube-", suffix=".pem")
        with os.fdopen(fd, "wb") as fh:
            fh.write(base64.b64decode(data))
        tmp.append(name)
        return name
    path = entry.get(key)
    if not path:
        return None
    resolved = Path(path).expanduser()
    return str(resolved if resolved.is_absolute() else base / resolved)


def load_kubeconfig(options: KubeOptions, env: Mapping[str, str]) -> KubeAccess:
    """The API server, TLS settings and credentials of the chosen context."""
    paths = kubeconfig_paths(env, options.kubeconfig)
    if options.kubeconfig and not paths[0].is_file():
        raise KubeDiscoveryError(
            f"no kubeconfig: {options.kubeconfig} does not exist", "kubeconfig"
        )
    if not paths:
        where = f"KUBECONFIG={env['KUBECONFIG']}" if env.get("KUBECONFIG") else "~/.kube/config"
        raise KubeDiscoveryError(
            f"no kubeconfig ({where} names no file): pass --kubeconfig, or the CDS address "
            "with --cds-server-address",
            "kubeconfig",
        )
    merged, origin = _merged(paths)
    context_name = options.context or merged["current-context"]
    if not context_name:
        raise KubeDiscoveryError(
            "the kubeconfig has no current context: pass --context", "kubeconfig"
        )
    context = merged["contexts"].get(context_name)
    if context is None:
        raise KubeDiscoveryError(f"the kubeconfig has no context {context_name!r}", "kubeconfig")
    cluster = merged["clusters"].get(context.get("cluster", ""))
    if not cluster or not cluster.get("server"):
        raise KubeDiscoveryError(
            f"context {context_name!r}: its cluster has no server", "kubeconfig"
        )
    user_name = context.get("user", "")
    user = merged["users"].get(user_name) or {}
    if user.get("exec") or user.get("auth-provider"):
        raise KubeDiscoveryError(
            f"context {context_name!r}: exec and auth-provider credentials are not supported; "
            "use a token or client certificate kubeconfig",
            "kubeconfig",
        )
    tmp: list[str] = []
    try:
        cbase = origin.get(f"clusters/{context.get('cluster', '')}", Path.cwd())
        ubase = origin.get(f"users/{user_name}", Path.cwd())
        ca = _material(cluster, "certificate-authority", cbase, tmp)
        try:
            ctx = ssl.create_default_context(cafile=ca)
            if cluster.get("insecure-skip-tls-verify"):
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            elif cluster.get("tls-server-name"):
                ctx.check_hostname = True
            cert = _material(user, "client-certificate", ubase, tmp)
            key = _material(user, "client-key", ubase, tmp)
            if cert and key:
                ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise KubeDiscoveryError(
                f"context {context_name!r}: cannot load its certificates: {exc}", "kubeconfig"
            ) from None
    finally:
        for name in tmp:
            with contextlib.suppress(OSError):
                os.unlink(name)
    token = user.get("token")
    if not token and user.get("tokenFile"):
        try:
            token = Path(user["tokenFile"]).read_text().strip()
        except OSError as exc:
            raise KubeDiscoveryError(
                f"cannot read tokenFile: {exc.strerror}", "kubeconfig"
            ) from None
    return KubeAccess(
        server=str(cluster["server"]).rstrip("/"),
        ssl_context=ctx,
        token=token or None,
        namespace=str(context.get("namespace") or "default"),
        context=context_name,
    )


@dataclass(frozen=True, slots=True)
class CdsPod:
    namespace: str
    name: str
    port: int


def _ready(pod: Mapping[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _cds_port(pod: Mapping[str, Any]) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "cds" and port.get("containerPort"):
                return int(port["containerPort"])
    return DEFAULT_CDS_PORT


def _refusal(exc: httpx.HTTPStatusError, what: str, access: KubeAccess) -> KubeDiscoveryError:
    status = exc.response.status_code
    if status in (401, 403):
        who = "the credentials were refused" if status == 401 else "forbidden"
        return KubeDiscoveryError(
            f"{what}: {who} by the API server at {access.server} "
            f"(context {access.context!r}, HTTP {status})",
            "forbidden",
        )
    return KubeDiscoveryError(f"{what}: the API server answered HTTP {status}")


class KubeApi:
    """The few API calls discovery makes."""

    def __init__(self, access: KubeAccess, timeout_s: float) -> None:
        self.access = access
        self._http = httpx.AsyncClient(
            base_url=access.server,
            verify=access.ssl_context,
            headers=access.headers,
            timeout=timeout_s,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str, what: str, **params: str) -> dict[str, Any]:
        try:
            response = await self._http.get(path, params=params or None)
            response.raise_for_status()
        except httpx.HTTPStatusError as exc:
            raise _refusal(exc, what, self.access) from None
        except httpx.HTTPError as exc:
            raise KubeDiscoveryError(
                f"cannot reach the API server at {self.access.server}: {exc or type(exc).__name__}",
                "unreachable",
            ) from None
        data: dict[str, Any] = response.json()
        return data

    async def find_cds(self, namespace: str | None) -> CdsPod:
        where = f"namespace {namespace}" if namespace else "any namespace"
        path = f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"
        listing = await self._get(path, f"listing CDS pods in {where}", labelSelector=CDS_LABEL)
        pods = listing.get("items") or []
        if not pods:
            raise KubeDiscoveryError(
                f"no CDS pod (label {CDS_LABEL}) in {where}: is STUNner installed"
                + (" there? (try without -n/--cds-server-namespace)" if namespace else "?")
            )
        ready = sorted(
            (p for p in pods if _ready(p)),
            key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]),
        )
        if not ready:
            names = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods)
            raise KubeDiscoveryError(
                f"{len(pods)} CDS pod(s) in {where} and none is ready: {names}"
            )
        namespaces = {p["metadata"]["namespace"] for p in ready}
        if len(namespaces) > 1:
            raise KubeDiscoveryError(
                f"CDS pods in several namespaces ({', '.join(sorted(namespaces))}): "
                "pick one with --cds-server-namespace"
            )
        pod = ready[0]
        return CdsPod(pod["metadata"]["namespace"], pod["metadata"]["name"], _cds_port(pod))

    async def cds_token(self, namespace: str) -> str | None:
        """The chart's CDS token, or None when the Secret is absent or not readable."""
        try:
            response = await self._http.get(
                f"/api/v1/namespaces/{quote(namespace)}/secrets/{CDS_TOKEN_SECRET}"
            )
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            log.debug("CDS token Secret: HTTP %d", response.status_code)
            return None
        data = (response.json().get("data") or {}).get(CDS_TOKEN_KEY)
        return base64.b64decode(data).decode().strip() or None if data else None


@dataclass
class CdsForward:
    """A local listener forwarding to the CDS pod through the API server."""

    api: KubeApi
    namespace_hint: str | None
    pod: CdsPod
    token: str | None
    server: asyncio.Server | None = None
    port: int = 0
    started_s: float = 0.0
    """Seconds from the start of discovery until the forward listened."""
    websockets_opened: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ws_url(self) -> str:
        split = urlsplit(self.api.access.server)
        scheme = "wss" if split.scheme == "https" else "ws"
        pod = self.pod
        return (
            f"{scheme}://{split.netloc}{split.path}/api/v1/namespaces/{quote(pod.namespace)}"
            f"/pods/{quote(pod.name)}/portforward?ports={pod.port}"
        )

    async def _open(self) -> ClientConnection:
        url = self._ws_url()
        ssl_ctx = self.api.access.ssl_context if url.startswith("wss:") else None
        ws = await connect(
            url,
            ssl=ssl_ctx,
            subprotocols=[Subprotocol(PORTFORWARD_PROTOCOL)],
            additional_headers=self.api.access.headers,
            open_timeout=10,
            ping_interval=None,
            max_size=None,
            compression=None,
        )
        self.websockets_opened += 1
        return ws

    async def _connect(self) -> ClientConnection:
        """A WebSocket to the pod; after a failure the pod is looked up again (it may have been
        replaced) and one more try is made."""
        try:
            return await self._open()
        except (OSError, WebSocketException, TimeoutError) as exc:
            log.info(
                "port-forward to %s/%s failed (%s): looking the CDS pod up again",
                self.pod.namespace,
                self.pod.name,
                _why(exc),
            )
        self.pod = await self.api.find_cds(self.namespace_hint)
        return await self._open()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ws = await self._connect()
        except (KubeDiscoveryError, OSError, WebSocketException, TimeoutError) as exc:
            log.warning("port-forward: %s", _why(exc))
            writer.close()
            return
        try:
            await _pump(ws, reader, writer)
        finally:
            await ws.close()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except asyncio.CancelledError:
            writer.close()  # the forward is closing: this connection ends with it
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
        await self.api.aclose()


def _why(exc: BaseException) -> str:
    if isinstance(exc, InvalidStatus):
        return f"the API server answered HTTP {exc.response.status_code}"
    return str(exc) or type(exc).__name__


async def _pump(
    ws: ClientConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Bytes both ways until either side ends; the channel's first message (its port) and the
    error channel's text are not data."""

    async def upstream() -> None:
        while data := await reader.read(65536):
            await ws.send(bytes([DATA_CHANNEL]) + data)

    async def downstream() -> None:
        seen: set[int] = set()
        async for message in ws:
            frame = message if isinstance(message, bytes) else message.encode()
            if not frame:
                continue
            channel, payload = frame[0], frame[1:]
            if channel not in seen:
                seen.add(channel)
                payload = payload[2:]
            if channel == DATA_CHANNEL and payload:
                writer.write(payload)
                await writer.drain()
            elif channel == ERROR_CHANNEL and payload:
                log.warning("port-forward error: %s", payload.decode(errors="replace"))

    up, down = asyncio.create_task(upstream()), asyncio.create_task(downstream())
    tasks = [up, down]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if up in done and down not in done:
            # The local side stopped sending: what the pod still sends may be the answer. The
            # channel protocol has no half-close, so wait a little for the pod to finish.
            await asyncio.wait({down}, timeout=LINGER_S)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def open_cds_forward(
    options: KubeOptions,
    env: Mapping[str, str],
    *,
    timeout_s: float = 10.0,
    fallback_token: str | None = None,
) -> AsyncIterator[CdsForward]:
    """Find the CDS pod through the kubeconfig and forward a local port to it while inside."""
    started = time.monotonic()
    access = load_kubeconfig(options, env)
    api = KubeApi(access, timeout_s)
    try:
        pod = await api.find_cds(options.namespace)
        token = await api.cds_token(pod.namespace) or fallback_token
    except BaseException:
        await api.aclose()
        raise
    forward = CdsForward(api, options.namespace, pod, token)
    try:
        await forward.start()
        forward.started_s = time.monotonic() - started
        log.info(
            "CDS pod %s/%s port %d forwarded to %s through %s",
            pod.namespace,
            pod.name,
            pod.port,
            forward.address,
            access.server,
        )
        yield forward
    finally:
        await forward.aclose()
