"""The health and metrics HTTP servers, rebound only when their endpoint changes.

This is the admin half of a reconcile: it owns both servers, applies the log level from the
config (unless the command line pinned one), and builds the `/status` document. The status names
every listener with its state (serving, retrying or rejected, with the reason), allocations, the
config revision and store epoch in force and the last rejection, and deliberately leaves out
credentials, secrets and TLS material. A health or metrics endpoint that cannot be bound is
reported in `admin.health_error` / `admin.metrics_error` and changes nothing else: the document
keeps every field.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from stunner_common.config import StunnerConfig
from stunner_common.loglevel import apply_log_spec
from stunnerd.admin.endpoint import (
    DEFAULT_HEALTH_PORT,
    DEFAULT_METRICS_PORT,
    BindAddress,
    parse_admin_endpoint,
)
from stunnerd.admin.health import health_handler
from stunnerd.admin.http import REQUEST_HEAD_TIMEOUT_S, Handler, HttpServer, Response
from stunnerd.bounds import Gt, Interval
from stunnerd.handoff.admin import HandedHttpServer, close_gently, listening_sockets
from stunnerd.handoff.transport.named import NamedSocket
from stunnerd.status import Lifecycle, ListenerState, Plan, Rejection, StatsSnapshot, TrafficStats

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)


def _traffic(t: TrafficStats, measured: bool) -> dict[str, dict[str, int]] | None:
    if not measured:
        return None
    return {
        "rx": {"pkts": t.rx_packets, "bytes": t.rx_bytes},
        "tx": {"pkts": t.tx_packets, "bytes": t.tx_bytes},
    }


def _listener_state(state: ListenerState | None) -> dict[str, Any]:
    if state is None:
        return {"state": "pending"}
    out: dict[str, Any] = {"state": state.state}
    if state.state != "serving":
        out["reason"] = state.reason
    if state.state == "retrying":
        out["attempts"] = state.attempts
    return out


def status_document(
    config: StunnerConfig | None,
    stats: StatsSnapshot,
    lifecycle: Lifecycle,
    revision: int | None,
    configs: Mapping[str, int] | None = None,
    *,
    epoch: str | None = None,
    listener_states: Mapping[str, ListenerState] | None = None,
    last_rejection: Rejection | None = None,
) -> dict[str, Any]:
    """The `/status` body: upstream's shape, secrets redacted, counts and state filled in."""
    doc: dict[str, Any] = {
        "version": "v1",
        "allocationCount": stats.allocations,
        "status": lifecycle.status_word,
        "revision": revision,
        "epoch": epoch,
        "configs": dict(configs or {}),
        "lastRejection": last_rejection.to_json() if last_rejection is not None else None,
    }
    if config is None:
        return doc
    states = listener_states or {}
    admin = config.admin
    doc["admin"] = {
        "name": admin.name,
        "loglevel": admin.loglevel,
        "metrics_endpoint": admin.metrics_endpoint,
        "healthcheck_endpoint": admin.healthcheck_endpoint,
        "quota": str(admin.user_quota),
        "offload": f"{admin.offload_engine}[{','.join(admin.offload_interfaces) or 'all'}]",
    }
    doc["auth"] = {"type": config.auth.type, "realm": config.auth.realm}
    doc["listeners"] = [
        {
            "name": lst.name,
            "protocol": lst.protocol,
            "address": lst.address,
            "port": lst.port,
            "public_address": lst.public_address,
            "public_port": lst.public_port,
            "routes": list(lst.routes),
            "allocations": stats.listener(lst.name).allocations,
            "connections": stats.listener(lst.name).connections,
            "stats": _traffic(stats.listener(lst.name).traffic, stats.traffic_measured),
            **_listener_state(states.get(lst.name)),
        }
        for lst in config.listeners
    ]
    cluster_stats = {c.name: c.traffic for c in stats.clusters}
    doc["clusters"] = [
        {
            "name": c.name,
            "type": c.type,
            "protocol": c.protocol,
            "endpoints": list(c.endpoints),
            "stats": _traffic(cluster_stats.get(c.name, TrafficStats()), stats.traffic_measured),
        }
        for c in config.clusters
    ]
    return doc


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class StatusSources:
    """Where `/status` and the apply metrics read what the caller keeps (the reconciler's state
    and anything the process adds, e.g. workers, offload, quota)."""

    revision: Callable[[], int | None] = _nothing
    epoch: Callable[[], str | None] = _nothing
    config_counts: Callable[[], Mapping[str, int]] = dict
    listener_states: Callable[[], Mapping[str, ListenerState]] = dict
    apply_failures: Callable[[], Mapping[str, int]] = dict
    last_rejection: Callable[[], Rejection | None] = _nothing
    extra_status: Callable[[], Mapping[str, Any]] = dict


@dataclass(frozen=True, slots=True)
class AdminSettings:
    """How the health and metrics servers listen, whatever the config says (the settings
    `STUNNERD_HEALTH_PORT`, `STUNNERD_METRICS_PORT`, `STUNNERD_ADMIN_REQUEST_TIMEOUT_S` and
    `STUNNERD_STATS_REFRESH_TIMEOUT_S`)."""

    health_port: Annotated[int, Interval(ge=0, le=65535)] | None = None
    """Serve health checks on this port whatever the config says (several on one host)."""
    metrics_port: Annotated[int, Interval(ge=0, le=65535)] | None = None
    """Serve metrics on this port whatever the config says, when the config enables them."""
    request_timeout_s: Annotated[float, Gt(0)] = REQUEST_HEAD_TIMEOUT_S
    """How long the servers wait for a request head (and for a reply to go)."""
    refresh_timeout_s: Annotated[float, Gt(0)] = 2.0
    """How long a scrape waits for fresh counters (from the workers) before serving the last."""


def _url(server: HttpServer, path: str = "") -> str:
    host = f"[{server.host}]" if ":" in server.host else server.host
    return f"http://{host}:{server.bound_port}{path}"


async def _listen(
    name: str,
    at: BindAddress,
    handler: Handler,
    request_timeout_s: float,
    handed: Sequence[NamedSocket] = (),
) -> HttpServer:
    """A started admin server; an OSError says `<name> server cannot listen on <at>: <why>`.
    It serves on the handed sockets of its name and address, when there are any."""
    socks = [
        h.sock for h in handed if h.name == name and h.host == at.host and at.port in (0, h.port)
    ]
    server: HttpServer
    if socks:
        server = HandedHttpServer(name, at, handler, socks, request_timeout_s=request_timeout_s)
    else:
        server = HttpServer(name, at.host, at.port, handler, request_timeout_s=request_timeout_s)
    try:
        await server.start()
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        why = f"{name} server cannot listen on {at.host}:{at.port}: {reason}"
        raise OSError(exc.errno, why) from exc
    return server


class AdminServers:
    """Owns the health and metrics servers of one stunnerd process."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        stats: Callable[[], StatsSnapshot],
        *,
        settings: AdminSettings = AdminSettings(),
        sources: StatusSources | None = None,
        log_override: str | None = None,
        refresh: Callable[[], Awaitable[None]] | None = None,
        bind_host: str | None = None,
        handed: Sequence[NamedSocket] = (),
    ) -> None:
        self.settings = settings
        self.handed = list(handed)
        """Listening sockets a previous stunnerd handed over, served where their address is
        asked for, until `release_handed`."""
        self.lifecycle = lifecycle
        self.sources = StatusSources() if sources is None else sources
        self._stats = stats
        self._refresh = refresh
        self._log_override = log_override
        # Where a wildcard admin endpoint binds: the listeners' --bind host unless that is a
        # wildcard too, so that `--bind 127.0.0.1` keeps every socket on loopback.
        self._bind_host = None if bind_host in (None, "", "0.0.0.0", "::") else bind_host
        self.health_error: str | None = None
        """Why the health server is not listening where it should (None when it is)."""
        self.metrics_error: str | None = None
        """Why the metrics server is not listening where the config asks (None when it is)."""
        self._config: StunnerConfig | None = None
        self.health: HttpServer | None = None
        self.metrics: HttpServer | None = None
        self._health_at: BindAddress | None = None
        self._metrics_at: BindAddress | None = None
        self._registry: CollectorRegistry | None = None  # built when metrics are first served

    def status(self) -> dict[str, Any]:
        sources = self.sources
        doc = status_document(
            self._config,
            self._stats(),
            self.lifecycle,
            sources.revision(),
            sources.config_counts(),
            epoch=sources.epoch(),
            listener_states=sources.listener_states(),
            last_rejection=sources.last_rejection(),
        )
        doc.update(sources.extra_status())
        admin = doc.get("admin")
        if isinstance(admin, dict):
            # Where the servers really listen (after --bind and a port override), and why not.
            if self.health is not None:
                admin["healthcheck_endpoint"] = _url(self.health)
            if self.metrics is not None and self._metrics_at is not None:
                admin["metrics_endpoint"] = _url(self.metrics, self._metrics_at.path)
            if self.metrics_error is not None:
                admin["metrics_error"] = self.metrics_error
            if self.health_error is not None:
                admin["health_error"] = self.health_error
        return doc

    def _bind(
        self, endpoint: str | None, default_port: int, port: int | None
    ) -> BindAddress | None:
        """Where a server listens: the config's endpoint, the port setting over its port, the
        --bind host over a wildcard host."""
        at = parse_admin_endpoint(endpoint, default_port)
        if at is None:
            return None
        if port is not None:
            at = BindAddress(at.host, port, at.path)
        if self._bind_host is not None and at.host in ("", "0.0.0.0", "::"):
            at = BindAddress(self._bind_host, at.port, at.path)
        return at

    async def start_health(self, endpoint: str | None) -> None:
        """Bring the health server up before any config (watch mode bootstrap)."""
        await self._rebind_health(
            self._bind(endpoint, DEFAULT_HEALTH_PORT, self.settings.health_port)
        )

    async def apply_admin(self, config: StunnerConfig, plan: Plan) -> Mapping[str, str]:
        """Bring both servers and the log level to `config`; return {cause: reason} of the
        endpoints that could not be bound (everything else applies all the same)."""
        self._config = config
        apply_log_spec(self._log_override or config.admin.loglevel)
        failed: dict[str, str] = {}
        admin = config.admin
        health_at = self._bind(
            admin.healthcheck_endpoint, DEFAULT_HEALTH_PORT, self.settings.health_port
        )
        metrics_at = self._bind(
            admin.metrics_endpoint, DEFAULT_METRICS_PORT, self.settings.metrics_port
        )
        if health_at != self._health_at or (self.health is None and health_at is not None):
            try:
                await self._rebind_health(health_at)
            except OSError as exc:
                failed["health_bind"] = str(exc)
        if metrics_at != self._metrics_at or (self.metrics is None and metrics_at is not None):
            await self._rebind_metrics(metrics_at)
            if self.metrics_error is not None:
                failed["metrics_bind"] = self.metrics_error
        return failed

    async def _rebind_health(self, at: BindAddress | None) -> None:
        await self._close_health()
        self._health_at = at
        if at is None:
            return
        handler = self._refreshing(health_handler(self.lifecycle, self.status), "/status")
        try:
            self.health = await _listen(
                "health", at, handler, self.settings.request_timeout_s, self.handed
            )
        except OSError as exc:
            self.health_error = exc.strerror
            raise

    async def _rebind_metrics(self, at: BindAddress | None) -> None:
        await self._close_metrics()
        self._metrics_at = at
        if at is None:
            return
        handler = self._refreshing(self._metrics_handler(at.path), None)
        try:
            self.metrics = await _listen(
                "metrics", at, handler, self.settings.request_timeout_s, self.handed
            )
        except OSError as exc:
            # TURN goes on without metrics: the config is applied, /status says why not.
            self.metrics_error = (
                f"{exc.strerror} (set STUNNERD_METRICS_PORT or another admin.metrics_endpoint)"
            )
            log.error("%s", self.metrics_error)

    def _metrics_handler(self, path: str) -> Callable[[str], Response]:
        """The `/metrics` handler; prometheus_client is imported only once metrics are served."""
        from stunnerd.admin.metrics import (
            ApplyFailureCollector,
            metrics_handler,
            metrics_registry,
        )

        if self._registry is None:
            self._registry = metrics_registry(self._stats)
            self._registry.register(
                ApplyFailureCollector(self.sources.apply_failures, self.sources.listener_states)
            )
        return metrics_handler(self._registry, path)

    async def _close_health(self) -> None:
        if self.health is not None:
            await self.health.close()
        self.health, self.health_error = None, None

    async def _close_metrics(self) -> None:
        if self.metrics is not None:
            await self.metrics.close()
        self.metrics, self.metrics_error = None, None

    def _refreshing(
        self, handler: Callable[[str], Response], only_path: str | None
    ) -> Callable[[str], Awaitable[Response]]:
        """Refresh the counters (e.g. from worker processes) before answering a scrape."""

        async def handle(path: str) -> Response:
            if self._refresh is not None and (only_path is None or path == only_path):
                try:
                    async with asyncio.timeout(self.settings.refresh_timeout_s):
                        await self._refresh()
                except TimeoutError:
                    log.warning("stats refresh timed out; serving the last known counters")
            return handler(path)

        return handle

    def listening(self) -> list[NamedSocket]:
        """What a successor takes over: the health and metrics servers' listening sockets."""
        return listening_sockets("health", self.health) + listening_sockets("metrics", self.metrics)

    async def let_go(self) -> None:
        """A successor serves on our listening sockets: stop accepting, finish what is in
        flight, close."""
        for server in (self.health, self.metrics):
            await close_gently(server, self.settings.request_timeout_s)
        self.health = self.metrics = None

    def release_handed(self) -> None:
        """The handed-over sockets are served (by duplicates) or not wanted: close ours."""
        for named in self.handed:
            named.sock.close()
        self.handed = []

    async def close(self) -> None:
        self.release_handed()
        for server in (self.health, self.metrics):
            if server is not None:
                await server.close()
        self.health = self.metrics = None
