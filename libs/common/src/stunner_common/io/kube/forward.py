"""Find the CDS (and stunnerd pods) through the Kubernetes API from a kubeconfig, as upstream's
tools do.

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
outlives a restarted CDS pod; it closes with the context. :func:`open_pod_forward` forwards to
any pod port the same way (stunnerctl's ``status`` reads each stunnerd pod's ``/status`` so).
The kubeconfig itself is read by :mod:`stunner_common.io.kube.config`; the pods and the
Secret are read with the one API client, :class:`stunner_common.io.kube.api.KubeApi`.

The CDS bearer token comes from the Secret the chart makes (``stunner-cds-token``, key
``token``, beside the CDS pod) when the user may read it, else from the caller's fallback
(``CDS_TOKEN``). Every failure is a :class:`KubeDiscoveryError` with one line for the user.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.typing import Subprotocol

from stunner_common.io.kube.api import KubeApi
from stunner_common.io.kube.config import (
    KubeAccess,
    KubeDiscoveryError,
    KubeOptions,
    kubeconfig_paths,
    load_kubeconfig,
    wants_kube_discovery,
)

__all__ = [
    "CDS_LABEL",
    "CDS_SERVICE",
    "CDS_TOKEN_KEY",
    "CDS_TOKEN_SECRET",
    "KubeAccess",
    "KubeApi",
    "KubeDiscoveryError",
    "KubeOptions",
    "Pod",
    "PodForward",
    "cds_token",
    "find_cds",
    "kubeconfig_paths",
    "load_kubeconfig",
    "open_cds_forward",
    "open_pod_forward",
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


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod port to forward to."""

    namespace: str
    name: str
    port: int

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}:{self.port}"


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready and not being deleted."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _named_port(pod: Mapping[str, Any], name: str, default: int) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("containerPort"):
                return int(port["containerPort"])
    return default


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    return pod["metadata"]["namespace"], pod["metadata"]["name"]


async def find_cds(api: KubeApi, namespace: str | None) -> Pod:
    """The ready CDS pod (in ``namespace``, else in any namespace) and its CDS port."""
    where = f"namespace {namespace}" if namespace else "any namespace"
    pods = await api.list_pods(namespace, CDS_LABEL, f"listing CDS pods in {where}")
    if not pods:
        raise KubeDiscoveryError(
            f"no CDS pod (label {CDS_LABEL}) in {where}: is STUNner installed"
            + (" there? (try without -n/--cds-server-namespace)" if namespace else "?")
        )
    ready = [p for p in pods if is_ready(p)]
    if not ready:
        names = ", ".join("/".join(_key(p)) for p in pods)
        raise KubeDiscoveryError(f"{len(pods)} CDS pod(s) in {where} and none is ready: {names}")
    namespaces = {p["metadata"]["namespace"] for p in ready}
    if len(namespaces) > 1:
        raise KubeDiscoveryError(
            f"CDS pods in several namespaces ({', '.join(sorted(namespaces))}): "
            "pick one with --cds-server-namespace"
        )
    pod = ready[0]
    return Pod(*_key(pod), _named_port(pod, "cds", DEFAULT_CDS_PORT))


async def cds_token(api: KubeApi, namespace: str) -> str | None:
    """The chart's CDS token, or None when the Secret is absent or not readable."""
    secret = await api.read_secret(namespace, CDS_TOKEN_SECRET)
    if secret is None:
        log.debug("CDS token Secret %s/%s: not readable", namespace, CDS_TOKEN_SECRET)
        return None
    data = (secret.get("data") or {}).get(CDS_TOKEN_KEY)
    return base64.b64decode(data).decode().strip() or None if data else None


PodLookup = Callable[[], Awaitable[Pod]]
"""Finds the pod again after a forwarded connection could not be opened (it may be replaced)."""


@dataclass
class PodForward:
    """A local listener forwarding each TCP connection to a pod port through the API server."""

    api: KubeApi
    pod: Pod
    relocate: PodLookup | None = None
    token: str | None = None
    """The CDS token read from the chart's Secret (CDS forwards only)."""
    owns_api: bool = True
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
            if self.relocate is None:
                raise
            log.info(
                "port-forward to %s failed (%s): looking the pod up again", self.pod, _why(exc)
            )
        self.pod = await self.relocate()
        return await self._open()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ws = await self._connect()
        except (KubeDiscoveryError, OSError, WebSocketException, TimeoutError) as exc:
            log.warning("port-forward to %s: %s", self.pod, _why(exc))
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
        if self.owns_api:
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
async def open_pod_forward(api: KubeApi, pod: Pod) -> AsyncIterator[PodForward]:
    """Forward a local port to ``pod`` through ``api`` (which the caller keeps) while inside."""
    forward = PodForward(api, pod, owns_api=False)
    try:
        await forward.start()
        log.debug("pod %s forwarded to %s", pod, forward.address)
        yield forward
    finally:
        await forward.aclose()


@contextlib.asynccontextmanager
async def open_cds_forward(
    options: KubeOptions,
    env: Mapping[str, str],
    *,
    timeout_s: float = 10.0,
    fallback_token: str | None = None,
) -> AsyncIterator[PodForward]:
    """Find the CDS pod through the kubeconfig and forward a local port to it while inside."""
    started = time.monotonic()
    access = load_kubeconfig(options, env)
    api = KubeApi(access, timeout_s)
    try:
        pod = await find_cds(api, options.namespace)
        token = await cds_token(api, pod.namespace) or fallback_token
    except BaseException:
        await api.aclose()
        raise

    async def relocate() -> Pod:
        return await find_cds(api, options.namespace)

    forward = PodForward(api, pod, relocate, token)
    try:
        await forward.start()
        forward.started_s = time.monotonic() - started
        log.info("CDS pod %s forwarded to %s through %s", pod, forward.address, access.server)
        yield forward
    finally:
        await forward.aclose()
