"""Prometheus metrics with upstream's `stunner_*` names and labels, read at scrape time.

Nothing is counted here: a collector turns the current `StatsSnapshot` (summed over workers) into
metric families on each scrape, so the packet path never touches prometheus_client. Cluster series
appear only once a cluster has relayed something, as upstream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from stunnerd.admin.http import Response
from stunnerd.status import ListenerState, StatsSnapshot


class StunnerCollector(Collector):
    def __init__(self, snapshot: Callable[[], StatsSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        active = GaugeMetricFamily("stunner_allocations_active", "Number of active allocations.")
        active.add_metric([], snap.allocations)
        yield active
        per_listener = GaugeMetricFamily(
            "stunner_listener_allocations_active",
            "Number of active allocations per listener.",
            labels=["name"],
        )
        conns = GaugeMetricFamily(
            "stunner_listener_connections",
            "Number of active downstream connections.",
            labels=["name"],
        )
        conns_total = CounterMetricFamily(
            "stunner_listener_connections",
            "Number of downstream connections opened.",
            labels=["name"],
        )
        l_pkts = CounterMetricFamily(
            "stunner_listener_packets", "Packets on listener sockets.", labels=["name", "direction"]
        )
        l_bytes = CounterMetricFamily(
            "stunner_listener_bytes", "Bytes on listener sockets.", labels=["name", "direction"]
        )
        refusals = CounterMetricFamily(
            "stunner_listener_refusals",
            "Error answers to TURN requests, by listener and error code (401 wrong credentials, "
            "403 peer admitted by no route, 486 quota, ...).",
            labels=["name", "code"],
        )
        limit_refusals = CounterMetricFamily(
            "stunner_listener_limit_refusals",
            "Refusals by listener and the limit behind them (docs/limits.md): answered (401 "
            "without a check, 486, 508, 400), dropped (a message over the size limit, a challenge "
            "over the source's rate) or a connection closed or refused.",
            labels=["name", "limit"],
        )
        for lst in snap.listeners:
            for code, count in lst.refusals:
                refusals.add_metric([lst.name, str(code)], count)
            for limit, count in lst.limit_refusals:
                limit_refusals.add_metric([lst.name, limit], count)
            per_listener.add_metric([lst.name], lst.allocations)
            conns.add_metric([lst.name], lst.connections)
            conns_total.add_metric([lst.name], lst.connections_total)
            if not snap.traffic_measured:
                continue
            l_pkts.add_metric([lst.name, "rx"], lst.traffic.rx_packets)
            l_pkts.add_metric([lst.name, "tx"], lst.traffic.tx_packets)
            l_bytes.add_metric([lst.name, "rx"], lst.traffic.rx_bytes)
            l_bytes.add_metric([lst.name, "tx"], lst.traffic.tx_bytes)
        c_pkts = CounterMetricFamily(
            "stunner_cluster_packets",
            "Datagrams relayed to and from peers.",
            labels=["name", "direction"],
        )
        c_bytes = CounterMetricFamily(
            "stunner_cluster_bytes",
            "Bytes relayed to and from peers.",
            labels=["name", "direction"],
        )
        for cl in snap.clusters:
            t = cl.traffic
            if not (t.rx_packets or t.tx_packets):
                continue
            c_pkts.add_metric([cl.name, "rx"], t.rx_packets)
            c_pkts.add_metric([cl.name, "tx"], t.tx_packets)
            c_bytes.add_metric([cl.name, "rx"], t.rx_bytes)
            c_bytes.add_metric([cl.name, "tx"], t.tx_bytes)
        yield from (per_listener, conns, conns_total, refusals, limit_refusals)
        if snap.traffic_measured:
            yield from (l_pkts, l_bytes, c_pkts, c_bytes)


class ApplyFailureCollector(Collector):
    """`stunner_config_apply_failures_total{reason}` and `stunner_listeners{state}`."""

    def __init__(
        self,
        failures: Callable[[], Mapping[str, int]],
        states: Callable[[], Mapping[str, ListenerState]],
    ) -> None:
        self._failures = failures
        self._states = states

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "stunner_config_apply_failures",
            "Config apply failures by reason: a listener that did not come up (port_in_use, "
            "bind_error, bad_certificate, listener_error; each try), a config refused whole "
            "(invalid_config, dataplane_error), an admin endpoint not bound (health_bind, "
            "metrics_bind).",
            labels=["reason"],
        )
        for reason, count in sorted(self._failures().items()):
            failures.add_metric([reason], count)
        listeners = GaugeMetricFamily(
            "stunner_listeners", "Configured listeners by state.", labels=["state"]
        )
        counts = {"serving": 0, "retrying": 0, "rejected": 0}
        for state in self._states().values():
            counts[state.state] = counts.get(state.state, 0) + 1
        for name, count in counts.items():
            listeners.add_metric([name], count)
        yield failures
        yield listeners


def metrics_registry(snapshot: Callable[[], StatsSnapshot]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StunnerCollector(snapshot))
    ProcessCollector(registry=registry)
    return registry


def metrics_handler(registry: CollectorRegistry, path: str = "/") -> Callable[[str], Response]:
    """Serve the exposition on `path`; `/` (upstream's default) catches every path."""

    def handle(request_path: str) -> Response:
        if path not in ("", "/") and request_path != path:
            return Response(404, b'{"status":404,"message":"not found"}')
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    return handle
