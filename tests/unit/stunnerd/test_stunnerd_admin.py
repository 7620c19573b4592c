"""Pure parts of the operations surface: origins, backoff, endpoints, probes, metrics."""

from __future__ import annotations

import json

import pytest

from stunnerd.admin.endpoint import BindAddress, EndpointError, parse_admin_endpoint
from stunnerd.admin.health import health_handler
from stunnerd.admin.metrics import metrics_handler, metrics_registry
from stunnerd.origin.base import ConfigOriginError, OriginSpec, parse_origin, resolve_id
from stunnerd.status import (
    ClusterStats,
    Lifecycle,
    ListenerStats,
    StatsSnapshot,
    TrafficStats,
    merge_snapshots,
)
from stunnerd.workers.pool import WorkerPool


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("file:///etc/stunnerd.conf", OriginSpec("file", "/etc/stunnerd.conf")),
        ("/etc/stunnerd/stunnerd.conf", OriginSpec("file", "/etc/stunnerd/stunnerd.conf")),
        ("conf/stunnerd.yaml", OriginSpec("file", "conf/stunnerd.yaml")),
        ("http://10.0.0.7:13478", OriginSpec("http", "http://10.0.0.7:13478")),
        ("https://cds.example:443/x", OriginSpec("http", "https://cds.example:443", tls=True)),
        ("ws://127.0.0.1:13478", OriginSpec("ws", "ws://127.0.0.1:13478")),
        ("wss://cds:1", OriginSpec("ws", "wss://cds:1", tls=True)),
        ("1.2.3.4:12345", OriginSpec("http", "http://1.2.3.4:12345")),
        ("1.2.3.4:12345/a/b", OriginSpec("http", "http://1.2.3.4:12345")),
        (":13478", OriginSpec("http", "http://127.0.0.1:13478")),
    ],
)
def test_origin_strings_are_classified_as_file_http_or_ws(text: str, spec: OriginSpec) -> None:
    assert parse_origin(text) == spec


@pytest.mark.parametrize("text", ["", "ftp://x:1", "http://", "file://"])
def test_unusable_origins_are_rejected_with_a_message(text: str) -> None:
    with pytest.raises(ConfigOriginError):
        parse_origin(text)


def test_the_id_comes_from_the_flag_then_the_env_pair_then_the_hostname() -> None:
    env = {"STUNNER_NAMESPACE": "stunner", "STUNNER_NAME": "udp-gateway"}
    assert resolve_id("a/b", env) == ("a", "b")
    assert resolve_id(None, env) == ("stunner", "udp-gateway")
    ns, name = resolve_id(None, {"STUNNER_NAME": "only-one"})
    assert ns == "default"
    assert name.startswith("stunnerd-")


@pytest.mark.parametrize("ident", ["noslash", "a/b/c", "/b", "a/"])
def test_an_id_without_exactly_one_slash_is_invalid(ident: str) -> None:
    with pytest.raises(ConfigOriginError, match="invalid id"):
        resolve_id(ident, {})


@pytest.mark.parametrize(
    ("value", "default_port", "expected"),
    [
        (None, 8086, BindAddress("0.0.0.0", 8086, "/")),
        ("", 8086, None),
        ("http://127.0.0.1:8086", 8086, BindAddress("127.0.0.1", 8086, "/")),
        ("http://:8087", 8086, BindAddress("0.0.0.0", 8087, "/")),
        ("http://", 8086, BindAddress("0.0.0.0", 8086, "/")),
        ("0.0.0.0", 8086, BindAddress("0.0.0.0", 8086, "/")),
        (None, 8080, None),
        ("http://127.0.0.1:9080/metrics", 8080, BindAddress("127.0.0.1", 9080, "/metrics")),
        ("http://127.0.0.1:9080", 8080, BindAddress("127.0.0.1", 9080, "/")),
        ("http://", 8080, BindAddress("0.0.0.0", 8080, "/")),
    ],
)
def test_admin_endpoints_parse_as_upstream(
    value: str | None, default_port: int, expected: BindAddress | None
) -> None:
    assert parse_admin_endpoint(value, default_port) == expected


def test_an_admin_endpoint_with_a_bad_port_is_an_error() -> None:
    with pytest.raises(EndpointError):
        parse_admin_endpoint("http://:99999", 8086)


def test_ready_follows_the_lifecycle_and_draining_wins_unless_forced() -> None:
    life = Lifecycle()
    handle = health_handler(life, lambda: {})
    assert handle("/live").status == 200
    assert handle("/ready").status == 503
    life.ready = True
    assert handle("/ready").status == 200
    assert json.loads(handle("/ready").body) == {"status": 200, "message": "READY"}
    life.draining = True
    assert handle("/ready").status == 503
    assert handle("/live").status == 200
    assert life.status_word == "TERMINATING"
    life.force_ready = True
    assert handle("/ready").status == 200
    assert handle("/nope").status == 404


def test_the_status_path_serves_the_status_document_as_json() -> None:
    handle = health_handler(Lifecycle(), lambda: {"allocationCount": 3})
    assert json.loads(handle("/status").body) == {"allocationCount": 3}


def test_snapshots_from_workers_sum_by_listener_and_cluster_and_round_trip() -> None:
    a = StatsSnapshot(
        (ListenerStats("udp", 2, 1, 1, TrafficStats(10, 1000, 9, 900)),),
        (ClusterStats("echo", TrafficStats(5, 50, 6, 60)),),
    )
    b = StatsSnapshot(
        (ListenerStats("udp", 3, 1, 1, TrafficStats(1, 100, 1, 100)), ListenerStats("tcp", 1)),
        (),
    )
    merged = merge_snapshots([a, b])
    assert merged.allocations == 6
    assert merged.listener("udp") == ListenerStats("udp", 5, 2, 2, TrafficStats(11, 1100, 10, 1000))
    assert merged.listener("tcp").allocations == 1
    assert StatsSnapshot.from_dict(json.loads(json.dumps(merged.to_dict()))) == merged


def test_metrics_use_the_upstream_names_and_hide_clusters_without_traffic() -> None:
    snap = StatsSnapshot(
        (ListenerStats("udp", 2, 1, 1, TrafficStats(21, 2100, 22, 2200)),),
        (ClusterStats("echo", TrafficStats(5, 50, 6, 60)), ClusterStats("denied")),
    )
    body = metrics_handler(metrics_registry(lambda: snap), "/metrics")("/metrics").body.decode()
    assert "stunner_allocations_active 2.0" in body
    assert 'stunner_listener_allocations_active{name="udp"} 2.0' in body
    assert 'stunner_listener_connections{name="udp"} 1.0' in body
    assert 'stunner_listener_connections_total{name="udp"} 1.0' in body
    assert 'stunner_listener_packets_total{direction="rx",name="udp"} 21.0' in body
    assert 'stunner_listener_bytes_total{direction="tx",name="udp"} 2200.0' in body
    assert 'stunner_cluster_packets_total{direction="tx",name="echo"} 6.0' in body
    assert 'name="denied"' not in body


def test_a_metrics_path_other_than_the_configured_one_is_not_found() -> None:
    handler = metrics_handler(metrics_registry(StatsSnapshot), "/metrics")
    assert handler("/other").status == 404
    assert metrics_handler(metrics_registry(StatsSnapshot), "/")("/anything").status == 200


def test_packet_and_byte_series_are_left_out_when_the_server_does_not_count_them() -> None:
    snap = StatsSnapshot((ListenerStats("udp", 1, 1, 1),), (), traffic_measured=False)
    body = metrics_handler(metrics_registry(lambda: snap), "/")("/").body.decode()
    assert 'stunner_listener_allocations_active{name="udp"} 1.0' in body
    assert "stunner_listener_packets_total" not in body
    assert "stunner_cluster_bytes_total" not in body
    merged = merge_snapshots([snap, StatsSnapshot()])
    assert merged.traffic_measured is False
    assert StatsSnapshot.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


def test_a_dead_worker_reports_nothing_until_its_replacement_answers_but_keeps_traffic() -> None:
    pool = WorkerPool(2)
    traffic = TrafficStats(10, 1000, 8, 800)
    for worker in pool.workers:
        worker.stats = StatsSnapshot(
            (ListenerStats("udp", allocations=1, connections=1, traffic=traffic),),
            (ClusterStats("echo", traffic),),
        )
    assert pool.stats().listener("udp").connections == 2

    pool._retire(pool.workers[0])  # what the watchdog does when worker 0 exits

    after = pool.stats()
    assert after.listener("udp").connections == 1
    assert after.allocations == 1
    assert after.listener("udp").traffic == traffic + traffic
    assert after.clusters == (ClusterStats("echo", traffic + traffic),)
    assert pool.workers[0].stats == StatsSnapshot()


def test_a_listener_no_live_worker_serves_is_not_reported_from_retired_traffic() -> None:
    pool = WorkerPool(1)
    pool.workers[0].stats = StatsSnapshot((ListenerStats("gone", traffic=TrafficStats(1, 1)),))
    pool._retire(pool.workers[0])
    assert pool.stats().listeners == ()
