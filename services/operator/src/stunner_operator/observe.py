"""The operator's health, readiness and Prometheus metrics.

``/healthz`` (liveness) answers 200 while the event loop runs. ``/readyz`` answers 200 once the
operator does its job: in local mode once the first full render reached Redis; in Kubernetes
mode, on the leader, once every watched resource was listed (the caches are synced) and that
first render was published, and on a standby replica once it has read the Lease (a standby must
be ready, or a rolling update with one replica would wait forever). Otherwise 503, with the
reason in the JSON body. Both are served on the health address (default ``:8081``), ``/metrics``
on the metrics address (default ``:8080``), as controller-runtime operators do.

In local mode the health address also answers ``/gateways``: every Gateway's state (``ok`` or
``degraded``, with the reasons: a rejected listener, a refused version kept at its last good one)
and the manifest errors in force. There is no API server to hold statuses there, so this is
where ``stunnerctl status`` reads them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from stunner_common.io.probe_http import HttpServer, Response
from stunner_operator.render.store import ObjectStore

log = logging.getLogger(__name__)

STORE_KINDS = (
    "GatewayClass",
    "Gateway",
    "UDPRoute",
    "UDPRouteV1A2",
    "GatewayConfig",
    "Dataplane",
    "StaticService",
    "Service",
    "EndpointSlice",
    "Secret",
    "Node",
    "Namespace",
)


class OperatorMetrics:
    """Every figure the operator exports, in its own registry, plus the readiness state."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.renders = Counter(
            "stunner_operator_renders", "Renders run (one per batch of changes)", registry=r
        )
        self.render_seconds = Histogram(
            "stunner_operator_render_duration_seconds",
            "Time one render took",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.objects = Gauge(
            "stunner_operator_objects", "Objects the operator holds, by kind", ["kind"], registry=r
        )
        self.configs = Gauge(
            "stunner_operator_configs",
            "stunnerd configs rendered (one per valid Gateway)",
            registry=r,
        )
        self.publishes = Counter(
            "stunner_operator_publishes", "Successful publishes of the config set", registry=r
        )
        self.publish_errors = Counter(
            "stunner_operator_publish_errors", "Failed publishes of the config set", registry=r
        )
        self.write_errors = Counter(
            "stunner_operator_kube_write_errors",
            "Failed Kubernetes writes (statuses, applies, deletes)",
            registry=r,
        )
        self.manifest_errors = Gauge(
            "stunner_operator_manifest_errors",
            "Manifest errors in force (local mode): documents or objects that fail to load, and "
            "Gateways refused for a rejected listener",
            registry=r,
        )
        self.leader = Gauge(
            "stunner_operator_leader", "1 while this replica holds the leader Lease", registry=r
        )
        self.watch_restarts = Counter(
            "stunner_operator_watch_restarts",
            "Watches that ended in an error or expired and were listed again",
            ["resource"],
            registry=r,
        )
        self.ready_gauge = Gauge("stunner_operator_ready", "1 when /readyz answers 200", registry=r)
        # Control loops (render, publish, write; upstream's renderer/updater/operator threads).
        self.loop_events = Counter(
            "stunner_operator_loop_events",
            "Events (batches of work) a control loop handled",
            ["loop"],
            registry=r,
        )
        self.loop_seconds = Histogram(
            "stunner_operator_loop_duration_seconds",
            "Time a control loop took to handle one event",
            ["loop"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.active_loops = Gauge(
            "stunner_operator_active_loops",
            "Control loops handling an event right now; one that stays up is a hung loop",
            ["loop"],
            registry=r,
        )
        self.loop_last_active = Gauge(
            "stunner_operator_loop_last_active_timestamp_seconds",
            "When a control loop last finished handling an event (Unix time)",
            ["loop"],
            registry=r,
        )
        self._published = False
        self._standby = False
        self._why = "starting: the first render is not published yet"

    # -- readiness ------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._published or self._standby

    @property
    def why_not_ready(self) -> str:
        return "" if self.ready else self._why

    def _update_ready(self) -> None:
        self.ready_gauge.set(1 if self.ready else 0)

    def mark_published(self) -> None:
        self.publishes.inc()
        self._published = True
        self._update_ready()

    def mark_publish_failed(self, why: str) -> None:
        self.publish_errors.inc()
        if not self._published:
            self._why = f"publishing the first render failed: {why}"

    def mark_standby(self) -> None:
        """A replica that has read the Lease and waits: ready, not leading."""
        self._standby = True
        self.leader.set(0)
        self._update_ready()

    def mark_leading(self) -> None:
        """Leading from now: ready again once the new term's first render is published."""
        self._standby = False
        self._published = False
        self._why = "leading: listing the cluster and publishing the first render"
        self.leader.set(1)
        self._update_ready()

    def mark_not_leading(self) -> None:
        self.leader.set(0)

    # -- control loops --------------------------------------------------------------------

    @contextlib.contextmanager
    def loop(self, name: str) -> Iterator[None]:
        """One event handled by control loop `name`: counted, timed, and shown as active (a
        loop that hangs inside leaves `stunner_operator_active_loops{loop=name}` raised)."""
        active = self.active_loops.labels(loop=name)
        active.inc()
        started = time.perf_counter()
        try:
            yield
        finally:
            active.dec()
            self.loop_events.labels(loop=name).inc()
            self.loop_seconds.labels(loop=name).observe(time.perf_counter() - started)
            self.loop_last_active.labels(loop=name).set_to_current_time()

    # -- rendering ------------------------------------------------------------------------

    def observe_render(self, seconds: float, store: ObjectStore, configs: int) -> None:
        self.renders.inc()
        self.render_seconds.observe(seconds)
        for kind in STORE_KINDS:
            self.objects.labels(kind=kind).set(sum(1 for _ in store.keys(kind)))
        self.configs.set(configs)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _json(status: int, body: dict[str, object]) -> Response:
    return Response(status, json.dumps(body).encode())


def parse_address(text: str, flag: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (every interface) or ``[v6]:port``; ValueError says why not."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{flag}: {text!r} is not HOST:PORT (e.g. :8081 or 127.0.0.1:8081)")
    host = host.strip("[]")
    return host or "0.0.0.0", int(port_text)


class ObservabilityServer:
    """The health and metrics HTTP servers (either may be off: address None)."""

    def __init__(
        self,
        metrics: OperatorMetrics,
        *,
        health_address: tuple[str, int] | None,
        metrics_address: tuple[str, int] | None,
    ) -> None:
        self.metrics = metrics
        self.gateway_report: Callable[[], dict[str, Any]] | None = None
        """What ``/gateways`` answers (local mode sets it); 404 while None."""
        self._servers: list[HttpServer] = []
        self.health: HttpServer | None = None
        self.prometheus: HttpServer | None = None
        if health_address is not None:
            self.health = HttpServer("health", *health_address, self._health)
            self._servers.append(self.health)
        if metrics_address is not None:
            self.prometheus = HttpServer("metrics", *metrics_address, self._metrics)
            self._servers.append(self.prometheus)

    def _health(self, path: str) -> Response:
        if path in ("/healthz", "/livez"):
            return _json(200, {"status": "ok"})
        if path == "/readyz":
            if self.metrics.ready:
                return _json(200, {"status": "ready"})
            return _json(503, {"status": "not ready", "reason": self.metrics.why_not_ready})
        if path == "/gateways" and self.gateway_report is not None:
            return _json(200, self.gateway_report())
        return _json(404, {"status": 404, "message": f"no such path {path}"})

    def _metrics(self, path: str) -> Response:
        if path != "/metrics":
            return _json(404, {"status": 404, "message": f"no such path {path}"})
        return Response(200, self.metrics.exposition(), CONTENT_TYPE_LATEST)

    async def start(self) -> None:
        started: list[HttpServer] = []
        try:
            for server in self._servers:
                await server.start()
                started.append(server)
        except BaseException:
            await _close(started)
            raise

    async def close(self) -> None:
        await _close(self._servers)


async def _close(servers: Iterable[HttpServer]) -> None:
    for server in servers:
        await server.close()
