"""Find each Gateway's stunnerd and read its `/status`.

The CDS knows the Gateways' configs but not where their stunnerds run, so the health server of
each is looked for in this order:

1. `--status-url URL` (repeatable): exactly these, nothing else; use it for any layout the
   rules below do not find.
2. When the CDS was found through the kubeconfig (a laptop beside a cluster): every ready pod of
   the Gateway (labels `app=stunner`, `stunner.l7mp.io/related-gateway-namespace` and `-name`),
   each reached through its own port-forward over the API server to the config's health port
   (8086 unless set; `--pod-port` replaces it), as upstream's stunnerctl does. One answer per pod.
3. The port of the config's `admin.healthcheck_endpoint` (8086 unless set; "" means disabled) on
   its host, or else on the Gateway's public address, or its listener address, or the CDS host.
   In a cluster this is the Gateway's LoadBalancer when the health-check port is exposed there.
4. On a loopback host, also the next ports, one per Gateway the CDS serves and a few more:
   `make run` gives each stunnerd the next health port that no other part of the stack holds
   and no other program uses (8086, 8087, 8089, ... past the auth service's 8088), the compose
   stack the next one.

`--health-port N` replaces the config's port in rules 3 and 4 (for a stack whose first health
port was moved, e.g. `scripts/run_local.py --health-port`).

Every answer is matched to its Gateway by the `admin.name` it reports, so a port that belongs to
another Gateway's stunnerd is never shown as this one's. Every request is bounded in time.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from stunner_common.config import StunnerConfig
from stunner_common.io.kube.forward import (
    KubeApi,
    KubeDiscoveryError,
    Pod,
    is_ready,
    open_pod_forward,
)

DEFAULT_HEALTH_PORT = 8086
LOOPBACK_SLACK = 8
"""Ports past one per Gateway tried on loopback (those `make run` skipped as taken)."""
_UNSPECIFIED = ("", "0.0.0.0", "::", "[::]")


@dataclass
class GatewayStatus:
    """What was found for one Gateway: its `/status` and where, or why nothing answered."""

    gateway: str
    url: str | None = None
    status: dict[str, Any] | None = None
    tried: list[str] = field(default_factory=list)
    reason: str = ""


def _concrete(host: str | None) -> str | None:
    if not host or host in _UNSPECIFIED or host.startswith("$") or host.startswith("__"):
        return None
    return host


def _url(host: str, port: int) -> str:
    bracketed = f"[{host}]" if ":" in host else host
    return f"http://{bracketed}:{port}/status"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def health_port_of(config: StunnerConfig) -> int | None:
    """The port of the config's health check (8086 unless set), None when it is disabled."""
    endpoint = config.admin.healthcheck_endpoint
    if endpoint is None:
        return DEFAULT_HEALTH_PORT
    if endpoint == "":
        return None
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    try:
        return parts.port or DEFAULT_HEALTH_PORT
    except ValueError:
        return None


def health_urls(
    config: StunnerConfig, cds_host: str, gateways_served: int, health_port: int | None = None
) -> list[str]:
    """Where this Gateway's stunnerd may answer `/status`, best guess first (rules 2 and 3)."""
    configured = health_port_of(config)
    if configured is None:
        return []
    port = health_port or configured
    endpoint = config.admin.healthcheck_endpoint or ""
    host = _concrete(urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}").hostname)
    for lst in config.listeners:
        host = host or _concrete(lst.public_address) or _concrete(lst.address)
    host = host or cds_host
    ports = [port]
    if _is_loopback(host):
        ports += [port + i for i in range(1, max(1, gateways_served) + LOOPBACK_SLACK)]
    return [_url(host, p) for p in ports]


async def fetch_operator_report(address: str, timeout_s: float) -> dict[str, Any]:
    """The operator's `/gateways` report (local mode), or {} when it does not answer one."""
    base = address if "://" in address else f"http://{address}"
    url = base.rstrip("/") + "/gateways"
    try:
        async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as http:
            reply = await http.get(url)
        doc = json.loads(reply.content) if reply.status_code == 200 else {}
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


async def fetch_status(http: httpx.AsyncClient, url: str) -> tuple[str, dict[str, Any] | None, str]:
    """(url, the /status document or None, why not)."""
    try:
        reply = await http.get(url)
    except httpx.TimeoutException:
        return url, None, "timed out"
    except httpx.HTTPError as exc:
        return url, None, str(exc) or type(exc).__name__
    if reply.status_code != 200:
        return url, None, f"HTTP {reply.status_code}"
    try:
        doc = json.loads(reply.content)
    except ValueError:
        return url, None, "not a stunnerd /status document"
    if not isinstance(doc, dict):
        return url, None, "not a stunnerd /status document"
    return url, doc, ""


def _name_of(doc: dict[str, Any]) -> str | None:
    admin = doc.get("admin")
    return str(admin.get("name")) if isinstance(admin, dict) and admin.get("name") else None


async def gather_status(
    configs: Sequence[StunnerConfig],
    *,
    cds_host: str,
    gateways_served: int,
    status_urls: Iterable[str] = (),
    health_port: int | None = None,
    timeout_s: float = 5.0,
) -> list[GatewayStatus]:
    """The status of every Gateway in `configs`, in their order."""
    explicit = [u if "://" in u else f"http://{u}" for u in status_urls]
    explicit = [
        u if urlsplit(u).path not in ("", "/") else u.rstrip("/") + "/status" for u in explicit
    ]
    plan = {
        c.admin.name: explicit or health_urls(c, cds_host, gateways_served, health_port)
        for c in configs
    }
    urls = sorted({u for tried in plan.values() for u in tried})
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as http:
        answers = await asyncio.gather(*(fetch_status(http, u) for u in urls))
    by_name: dict[str, tuple[str, dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    for url, doc, why in answers:
        name = _name_of(doc) if doc is not None else None
        if doc is not None and name is not None:
            by_name.setdefault(name, (url, doc))
        else:
            errors[url] = why or "its /status names no Gateway"
    out = []
    for config in configs:
        gw = config.admin.name
        tried = plan[gw]
        if gw in by_name:
            url, doc = by_name[gw]
            out.append(GatewayStatus(gw, url, doc, tried))
            continue
        if not tried:
            reason = "its health check is disabled (admin.healthcheck_endpoint is empty)"
        else:
            # The first port's reason: the others are guesses (loopback slack).
            reason = "; ".join(dict.fromkeys(errors[u] for u in tried[:1] if u in errors))
            if any(u not in errors for u in tried):
                reason = (reason + "; " if reason else "") + "the others serve other Gateways"
        out.append(GatewayStatus(gw, tried=tried, reason=reason))
    return out


STUNNERD_SELECTOR = "app=stunner"
GATEWAY_NAMESPACE_LABEL = "stunner.l7mp.io/related-gateway-namespace"
GATEWAY_NAME_LABEL = "stunner.l7mp.io/related-gateway-name"


async def _pod_status(api: KubeApi, pod: Pod, gateway: str, timeout_s: float) -> GatewayStatus:
    where = f"pod {pod}"
    try:
        async with (
            open_pod_forward(api, pod) as forward,
            httpx.AsyncClient(timeout=timeout_s, trust_env=False) as http,
        ):
            _url, doc, why = await fetch_status(http, f"http://{forward.address}/status")
    except OSError as exc:
        doc, why = None, str(exc) or type(exc).__name__
    if doc is None:
        return GatewayStatus(gateway, tried=[where], reason=why or "no answer")
    return GatewayStatus(gateway, where, doc, [where])


async def _gateway_pods(
    api: KubeApi, config: StunnerConfig, pod_port: int | None, timeout_s: float
) -> list[GatewayStatus]:
    gateway = config.admin.name
    ns, _, name = gateway.rpartition("/")
    port = pod_port or health_port_of(config)
    if port is None:
        why = "its health check is disabled (admin.healthcheck_endpoint is empty)"
        return [GatewayStatus(gateway, reason=why)]
    selector = f"{STUNNERD_SELECTOR},{GATEWAY_NAMESPACE_LABEL}={ns},{GATEWAY_NAME_LABEL}={name}"
    try:
        pods = await api.list_pods(ns or None, selector, f"listing the stunnerd pods of {gateway}")
    except KubeDiscoveryError as exc:
        return [GatewayStatus(gateway, reason=str(exc))]
    ready = [p for p in pods if is_ready(p)]
    if not ready:
        names = ", ".join(p["metadata"]["name"] for p in pods)
        reason = (
            f"{len(pods)} stunnerd pod(s), none ready: {names}"
            if pods
            else f"no stunnerd pod ({selector}) in namespace {ns}"
        )
        return [GatewayStatus(gateway, reason=reason)]
    targets = [Pod(p["metadata"]["namespace"], p["metadata"]["name"], port) for p in ready]
    return list(
        await asyncio.gather(*(_pod_status(api, pod, gateway, timeout_s) for pod in targets))
    )


async def gather_pod_status(
    configs: Sequence[StunnerConfig],
    api: KubeApi,
    *,
    pod_port: int | None = None,
    timeout_s: float = 5.0,
) -> list[GatewayStatus]:
    """Rule 2: the status of every ready stunnerd pod of each Gateway, through port-forwards."""
    per_gateway = await asyncio.gather(
        *(_gateway_pods(api, config, pod_port, timeout_s) for config in configs)
    )
    return [status for statuses in per_gateway for status in statuses]
