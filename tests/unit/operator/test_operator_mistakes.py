"""Local mode's mistakes are loud, precise and not destructive.

A Gateway listener the renderer rejects keeps the Gateway's last good version (listeners and
allocations live on); a later schema error keeps the last good version of that object, not the
rejected one; the error names the real cause and counts in the error metric; `/gateways` shows
the Gateway as degraded; a route to a Gateway that does not exist gets a warning and a dry-run
line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from stunner_operator.dryrun import dry_run
from stunner_operator.manifests.loader import ManifestSet, parse_manifests
from stunner_operator.manifests.local import LocalOperator
from stunner_operator.observe import ObservabilityServer, OperatorMetrics
from stunner_operator.render.status import RouteStatus
from support.operator import HIERARCHY, UDP_GATEWAY

ROUTE = """
apiVersion: stunner.l7mp.io/v1
kind: StaticService
metadata: {name: echo, namespace: stunner}
spec: {prefixes: [10.0.0.1/32]}
---
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata: {name: echo, namespace: stunner}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{group: stunner.l7mp.io, kind: StaticService, name: echo}]}]
"""
GW = ("Gateway", "stunner", "gw")


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _listeners(op: LocalOperator) -> list[tuple[str, str, int]]:
    config = op.renderer.configs()["stunner/gw"]
    return [(lst.name, lst.protocol, lst.port) for lst in config.listeners]


def test_a_rejected_listener_keeps_the_gateways_last_good_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "h.yaml").write_text(HIERARCHY + "\n---\n" + ROUTE)
    gw = tmp_path / "gw.yaml"
    gw.write_text(UDP_GATEWAY)
    op = LocalOperator(tmp_path, None)
    op.sync()
    good = _listeners(op)
    assert good == [("stunner/gw/udp", "TURN-UDP", 3478)]
    assert op.metrics.manifest_errors._value.get() == 0

    caplog.set_level("INFO", logger="stunner_operator")
    gw.write_text(UDP_GATEWAY.replace("TURN-UDP", "TURN-FOO"))
    op.sync()
    assert _listeners(op) == good, "the live listener (and its allocations) must stay"
    (error,) = _errors(caplog)
    assert error.startswith("Gateway stunner/gw: listener udp: unsupported protocol 'TURN-FOO'")
    assert "keeping the last good version of this Gateway" in error
    assert "allowedRoutes" not in " ".join(r.getMessage() for r in caplog.records)
    assert op.metrics.manifest_errors._value.get() == 1
    report = op.gateway_report()
    (entry,) = report["gateways"]
    assert entry["name"] == "stunner/gw"
    assert entry["state"] == "degraded"
    assert "unsupported protocol 'TURN-FOO'" in entry["reasons"][0]

    # A schema error next: that object keeps its last GOOD version, not the TURN-FOO one.
    caplog.clear()
    gw.write_text(UDP_GATEWAY.replace("TURN-UDP", "TURN-FOO").replace("3478", "70000"))
    op.sync()
    (error,) = _errors(caplog)
    assert "keeping the last good version of Gateway stunner/gw" in error
    assert "this file" not in error
    assert _listeners(op) == good
    assert op.metrics.manifest_errors._value.get() == 2  # the schema error and the refusal

    # Back to exactly the good version: the refusal is over, although nothing changes.
    gw.write_text(UDP_GATEWAY)
    op.sync()
    assert op.metrics.manifest_errors._value.get() == 0
    assert op.gateway_report()["gateways"][0]["state"] == "ok"
    assert _listeners(op) == good

    # Fixed: the new version is in force, nothing is reported any more.
    caplog.clear()
    gw.write_text(UDP_GATEWAY.replace("3478", "3480"))
    op.sync()
    assert _listeners(op) == [("stunner/gw/udp", "TURN-UDP", 3480)]
    assert _errors(caplog) == []
    assert op.metrics.manifest_errors._value.get() == 0
    assert op.gateway_report()["gateways"][0]["state"] == "ok"


def test_a_new_gateway_with_a_rejected_listener_serves_the_others_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    two = UDP_GATEWAY + "  - {name: bad, port: 3479, protocol: TURN-FOO}\n"
    (tmp_path / "all.yaml").write_text(HIERARCHY + "\n---\n" + two)
    caplog.set_level("INFO", logger="stunner_operator")
    op = LocalOperator(tmp_path, None)
    op.sync()
    assert _listeners(op) == [("stunner/gw/udp", "TURN-UDP", 3478)]
    (error,) = _errors(caplog)
    assert "listener bad: unsupported protocol 'TURN-FOO'" in error
    assert "the listener is left out" in error
    assert op.gateway_report()["gateways"][0]["state"] == "degraded"


def test_a_route_only_on_rejected_listeners_names_them_not_allowed_routes(tmp_path: Path) -> None:
    (tmp_path / "all.yaml").write_text(
        HIERARCHY + "\n---\n" + UDP_GATEWAY.replace("TURN-UDP", "TURN-FOO") + "\n---\n" + ROUTE
    )
    op = LocalOperator(tmp_path, None)
    op.sync()
    status = op.renderer.statuses()[("UDPRoute", "stunner", "echo")]
    assert isinstance(status, RouteStatus)
    message = status.parents[0].conditions[0].message
    assert "unsupported protocol 'TURN-FOO'" in message
    assert "allowedRoutes" not in message


def test_a_schema_error_names_the_object_that_keeps_its_last_good_version(tmp_path: Path) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(HIERARCHY + "\n---\n" + UDP_GATEWAY + "\n---\n" + ROUTE)
    ms = ManifestSet(tmp_path)
    first = ms.reload()
    # The Gateway breaks and the documents move: the Gateway still keeps its own last version.
    path.write_text(ROUTE + "\n---\n" + HIERARCHY + "\n---\n" + UDP_GATEWAY.replace("3478", "0x"))
    second = ms.reload()
    (err,) = second.new_errors
    assert err.key == GW
    assert err.keeps == "keeping the last good version of Gateway stunner/gw"
    assert second.objects[GW] == first.objects[GW]
    assert parse_manifests("kind: [", "x.yaml").errors[0].keeps.endswith("of this document")


def test_a_route_to_a_missing_gateway_is_a_warning_and_a_dry_run_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "all.yaml").write_text(
        HIERARCHY + "\n---\n" + UDP_GATEWAY + "\n---\n" + ROUTE.replace("name: gw}", "name: nope}")
    )
    caplog.set_level("INFO", logger="stunner_operator")
    LocalOperator(tmp_path, None).sync()
    (warning,) = _warnings(caplog)
    assert warning == (
        "UDPRoute stunner/echo: parent Gateway stunner/nope does not exist, so no listener "
        "carries this route (Gateways: stunner/gw)"
    )
    problems = dry_run(tmp_path).problems
    assert any(
        "document 5: UDPRoute stunner/echo: parent Gateway stunner/nope does not exist" in p
        for p in problems
    ), problems


async def test_the_health_server_reports_gateways_in_local_mode(tmp_path: Path) -> None:
    import httpx

    (tmp_path / "all.yaml").write_text(HIERARCHY + "\n---\n" + UDP_GATEWAY)
    op = LocalOperator(tmp_path, None)
    op.sync()
    server = ObservabilityServer(
        OperatorMetrics(), health_address=("127.0.0.1", 0), metrics_address=None
    )
    server.gateway_report = op.gateway_report
    await server.start()
    try:
        assert server.health is not None
        async with httpx.AsyncClient() as http:
            reply = await http.get(f"http://127.0.0.1:{server.health.bound_port}/gateways")
        doc = json.loads(reply.content)
        assert doc["gateways"][0]["name"] == "stunner/gw"
        assert doc["gateways"][0]["state"] == "ok"
        assert doc["manifestErrors"] == []
    finally:
        await server.close()
