"""The official Gateway API conformance suite, profile GATEWAY-UDP, against our operator.

The suite's test binary (``go test -c`` of sigs.k8s.io/gateway-api/conformance at the pinned
version, built once into the Go cache) runs against this tier's real API server, with
ReferenceGrants enforced and support.gwapi_conformance's stand-ins for the scheduler and the
cloud load balancer. It writes its own ``--report-output`` YAML into the test's folder.

Every test about the Gateway API objects (GatewayClass, Gateway, UDPRoute and ReferenceGrant
statuses and attachment) must pass; the ones that fail must fail where and why
``KNOWN_FAILURES`` says: traffic checks that need a plain UDP proxy, Gateway tests that presume
HTTP/HTTPS listeners. docs/conformance/ holds the published run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support import gobin
from support.gwapi_conformance import (
    KNOWN_FAILURES,
    PROFILE,
    SuiteRun,
    conformance_cluster,
    run_suite,
    unexpected,
)

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SuiteRun]:
    gobin.require_go()
    gobin.gateway_api_conformance()  # the build, outside the suite's own clock
    workdir = tmp_path_factory.mktemp("gwapi-conformance")
    with conformance_cluster(workdir / "cluster") as (stack, _node, stand_ins):
        run = run_suite(stack, stand_ins, workdir / "suite")
        assert not stand_ins.errors, stand_ins.errors
        yield run


def _report(run: SuiteRun) -> dict[str, object]:
    assert run.report.exists(), f"no report; the suite's output is in {run.log}"
    report = yaml.safe_load(run.report.read_text())
    assert isinstance(report, dict)
    return report


def test_the_suite_writes_its_report_for_the_udp_profile(suite_run: SuiteRun) -> None:
    report = _report(suite_run)
    profiles = report["profiles"]
    assert isinstance(profiles, list)
    (profile,) = [p for p in profiles if p["name"] == PROFILE]
    assert profile["core"]["result"] in ("success", "failure", "partial")
    assert report["gatewayAPIVersion"] == gobin.GATEWAY_API_VERSION


def test_every_api_object_test_passes_and_each_failure_is_a_documented_one(
    suite_run: SuiteRun,
) -> None:
    assert suite_run.results, f"no test results; the suite's output is in {suite_run.log}"
    problems = unexpected(suite_run.results)
    assert not problems, f"{problems}\n(the suite's output is in {suite_run.log})"


@pytest.mark.parametrize(
    "name",
    [
        "GatewayClassObservedGenerationBump",
        "UDPRouteInvalidBackendRefNonexistent",
        "UDPRouteInvalidCrossNamespaceBackendRef",
        "UDPRouteNotAllowedByListeners",
    ],
)
def test_status_only_tests_pass_whole(suite_run: SuiteRun, name: str) -> None:
    assert suite_run.results.get(name) == "PASS", suite_run.log


def test_status_subtests_of_tests_with_traffic_checks_pass(suite_run: SuiteRun) -> None:
    status_subtests = {
        "UDPRouteReferenceGrant": [
            "UDPRoute_with_cross-namespace_backendRef_and_a_permitting_ReferenceGrant_has_"
            "ResolvedRefs=True",
            "UDPRoute_has_ResolvedRefs=False_with_reason_RefNotPermitted_after_deleting_the_"
            "ReferenceGrant",
        ],
        "UDPRouteMultipleRoutesAttachment": [
            "Both_UDPRoutes_should_be_Accepted_by_the_Gateway",
            "Gateway_listener_should_report_2_attached_Routes",
        ],
        "UDPRouteParentRefAttachAllListeners": [
            "UDPRoute_is_accepted_by_the_Gateway",
            "Every_UDP_listener_on_the_Gateway_has_the_UDPRoute_attached",
        ],
        "GatewayListenerUnsupportedProtocol": [
            "Gateway_with_no_accepted_listeners_should_not_be_accepted_and_the_listener_should_"
            "have_the_Accepted_condition_set_to_False_with_reason_UnsupportedProtocol",
        ],
    }
    missing = {
        f"{test}/{sub}": suite_run.results.get(f"{test}/{sub}")
        for test, subs in status_subtests.items()
        for sub in subs
        if suite_run.results.get(f"{test}/{sub}") != "PASS"
    }
    assert not missing, f"{missing} (the suite's output is in {suite_run.log})"


def test_routes_attached_by_port_and_section_name_match_before_their_echo_fails(
    suite_run: SuiteRun,
) -> None:
    """UDPRouteParentRefPortAndSectionName checks each route's parents, then echoes, in one
    subtest: the echo fails it, so the log has to show that the parents matched."""
    text = suite_run.log.read_text()
    for route in ("udp-route-by-port", "udp-route-by-section", "udp-route-by-section-and-port"):
        line = f"Route gateway-conformance-infra/{route} Parents matched expectations"
        assert line in text, f"{line!r} not in {suite_run.log}"


def test_known_failures_name_tests_of_the_profile(suite_run: SuiteRun) -> None:
    ran = {name for name, outcome in suite_run.results.items() if outcome != "SKIP"}
    assert set(KNOWN_FAILURES) <= ran


def test_the_published_report_is_of_the_pinned_version() -> None:
    published = Path(__file__).resolve().parents[3] / "docs" / "conformance"
    report = yaml.safe_load((published / "gateway-udp-report.yaml").read_text())
    assert report["gatewayAPIVersion"] == gobin.GATEWAY_API_VERSION
