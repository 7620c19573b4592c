"""`bench control`'s pure parts (bench/control_report.py): combos, convergence, audit counting."""

from __future__ import annotations

import json
import math

import pytest

from support.bench_modules import bench_module


def test_counts_parse_from_a_comma_list() -> None:
    report = bench_module("control_report")
    assert report.parse_counts("100, 300,") == [100, 300]
    with pytest.raises(ValueError, match="at least 1"):
        report.parse_counts("0")


def test_a_combo_is_converged_when_served_with_its_route_and_accepted() -> None:
    report = bench_module("control_report")
    configs = {
        "bench-ns-0/bench-gw-0": {"clusters": [{"name": "bench-ns-0/bench-udproute-0"}]},
        "bench-ns-1/bench-gw-1": {"clusters": []},
        "bench-ns-2/bench-gw-2": {"clusters": [{"name": "bench-ns-2/bench-udproute-2"}]},
    }
    gateways = [
        {
            "metadata": {"namespace": f"bench-ns-{i}", "name": f"bench-gw-{i}"},
            "status": {"conditions": [{"type": "Accepted", "status": status}]},
        }
        for i, status in ((0, "True"), (1, "True"), (2, "False"))
    ]
    accepted = report.accepted_gateways(gateways)
    assert accepted == {0, 1}
    assert report.converged(configs, accepted, range(4)) == [1, 2, 3]


def test_operator_writes_count_only_its_writes_in_the_window_and_leases_apart() -> None:
    report = bench_module("control_report")

    def event(verb: str, user: str, agent: str, resource: str, at: str, sub: str = "") -> str:
        ref = {"resource": resource, **({"subresource": sub} if sub else {})}
        return json.dumps(
            {
                "verb": verb,
                "user": {"username": user},
                "userAgent": agent,
                "objectRef": ref,
                "stageTimestamp": at,
            }
        )

    op = "system:serviceaccount:stunner:stunner-operator"
    lines = [
        event("patch", op, "x", "gateways", "2026-01-01T00:00:01.000000Z", "status"),
        event("create", op, "x", "deployments", "2026-01-01T00:00:02.000000Z"),
        event("update", op, "x", "leases", "2026-01-01T00:00:02.000000Z"),
        event("get", op, "x", "gateways", "2026-01-01T00:00:02.000000Z"),
        event("patch", "kubernetes-admin", "python-httpx", "gateways", "2026-01-01T00:00:02Z"),
        event("create", op, "x", "services", "2026-01-01T00:09:00.000000Z"),
        "not json",
    ]
    start = 1767225600.0  # 2026-01-01T00:00:00Z
    writes = report.operator_writes(lines, report.user_agent_is((), op), start, start + 60)
    assert writes.total == 2
    assert writes.leases == 1
    assert writes.by_kind == {"patch gateways/status": 1, "create deployments": 1}
    upstream = report.user_agent_is(("stunner-gateway-operator",), "kubernetes-admin")
    assert upstream(
        {"user": {"username": "kubernetes-admin"}, "userAgent": "stunner-gateway-operator/v"}
    )
    assert not upstream(
        {"user": {"username": "kubernetes-admin"}, "userAgent": "python-httpx/0.28"}
    )


def test_marker_addresses_round_trip_through_a_frame() -> None:
    report = bench_module("control_report")
    frame = json.dumps(
        {"endpoints": ["10.20.0.1", report.marker_address(3), report.marker_address(70000)]}
    ).encode()
    assert report.marker_address(0) == "10.128.0.0"
    assert report.newest_marker(frame) == 70000
    assert report.newest_marker(b'{"endpoints": ["10.20.0.1"]}') == -1


def test_ratio_lines_say_when_upstream_did_not_converge() -> None:
    report = bench_module("control_report")
    writes = report.Writes(total=500)
    ours = report.SideResult("ours", 100, 5.0, 0, 10.0, 100.0, 0.1, writes, "audit log")
    theirs = report.SideResult("upstream", 100, 10.0, 3, 5.0, 50.0, 0.2, writes, "audit log")
    lines = report.report_lines([ours, theirs])
    assert "RATIO control N=100 peak_rss ours/upstream = 2.00" in lines
    assert "RATIO control N=100 writes_per_combo ours/upstream = 1.00" in lines
    assert any("converge_s ours/upstream: upstream left 3 of 100" in line for line in lines)


def test_a_histogram_quantile_between_two_scrapes_is_its_bucket_bound() -> None:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    cr = bench_module("control_report")
    registry = CollectorRegistry()
    fanout = Histogram("fanout_seconds", "x", buckets=(0.001, 0.01, 0.1), registry=registry)
    sent = Counter("sent", "x", ["mode"], registry=registry)
    for _ in range(50):  # before the first scrape: not counted
        fanout.observe(0.5)
    sent.labels("v2").inc(3)
    before = cr.metric_samples(generate_latest(registry).decode())
    for _ in range(98):
        fanout.observe(0.0005)
    fanout.observe(0.005)
    fanout.observe(0.05)
    sent.labels("v2").inc(7)
    after = cr.metric_samples(generate_latest(registry).decode())
    assert cr.bucket_quantile(before, after, "fanout_seconds", 0.98) == 0.001
    assert cr.bucket_quantile(before, after, "fanout_seconds", 0.99) == 0.01
    assert cr.bucket_quantile(before, after, "fanout_seconds", 1.0) == 0.1
    assert cr.sample_delta(before, after, "sent_total", mode="v2") == 7
    fanout.observe(5.0)
    later = cr.metric_samples(generate_latest(registry).decode())
    assert cr.bucket_quantile(after, later, "fanout_seconds", 0.99) == float("inf")
    assert math.isnan(cr.bucket_quantile(later, later, "fanout_seconds", 0.99))
