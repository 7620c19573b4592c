"""The official Gateway API conformance suite, profile GATEWAY-UDP, against our operator.

The suite's own test binary (support.gobin.gateway_api_conformance, pinned GATEWAY_API_VERSION)
runs against the real-API-server stack (support.kube_stack) with ReferenceGrants enforced
(``OPERATOR_ENFORCE_REFERENCE_GRANTS=true``) and writes its ``--report-output`` YAML. The
cluster has no kubelet, scheduler or cloud provider, so ``ClusterStandIns`` plays their parts
for the suite's namespaces: it binds pods to a kwok node (kwok reports them Ready), gives each
LoadBalancer Service a loopback address (127.0.1.N), and marks the Gateways STUNner cannot serve
at all (only HTTP/HTTPS listeners: the suite's base manifests) with the suite's own
``gateway-api/skip-this-for-readiness`` annotation, since the suite waits for every Gateway of
its infrastructure namespaces to be Programmed before each test.

``KNOWN_FAILURES`` says, test by test, which (sub)tests fail and why: the traffic checks send
raw DNS or echo datagrams to the Gateway's address, which a TURN gateway relays only for TURN
clients; the suite's Gateway tests presume HTTP/HTTPS listeners. Everything else must pass.

``python -m support.gwapi_conformance --out docs/conformance`` (run from tests/) regenerates
the published report and the results table of docs/conformance/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from support import gobin
from support.chart import load_documents
from support.kube import KubeClient, KubeError
from support.kube_stack import CONTROLLER_NAME, NAMESPACE, KubeStack
from support.kwok_node import APISERVER_ARGS, NODE_NAME, KwokNode, kwok_node

log = logging.getLogger(__name__)

PROFILE = "GATEWAY-UDP"
GATEWAY_CLASS = "stunner-conformance"
NAMESPACES = (
    "gateway-conformance-infra",
    "gateway-conformance-app-backend",
    "gateway-conformance-web-backend",
)
SKIP_READINESS = "gateway-api/skip-this-for-readiness"
SERVED_PROTOCOLS = frozenset(
    {"TURN-UDP", "TURN-TCP", "TURN-TLS", "TURN-DTLS", "UDP", "TCP", "TLS", "DTLS"}
)
OPERATOR_ENV = {"OPERATOR_ENFORCE_REFERENCE_GRANTS": "true"}
REPORT_NAME = "gateway-udp-report.yaml"
LOG_NAME = "conformance.log"
RUN_TIMEOUT_S = 1500.0

# The suite's waits (seconds), short: a status that is right comes within a second or two
# here; the checks that cannot pass (traffic, HTTP listeners) spend the whole wait.
TIMEOUTS: Mapping[str, int] = {
    "GWCMustBeAccepted": 60,
    "NamespacesMustBeReady": 120,
    "GatewayMustHaveAddress": 30,
    "GatewayMustHaveCondition": 30,
    "GatewayStatusMustHaveListeners": 20,
    "GatewayListenersMustHaveConditions": 20,
    "UDPRouteMustHaveCondition": 30,
    "RouteMustHaveParents": 30,
    "LatestObservedGenerationSet": 30,
    "DefaultTestTimeout": 10,
    "MaxTimeToConsistency": 10,
}

IMPLEMENTATION = {
    "organization": "stunner-py",
    "project": "stunner-operator",
    "url": "https://github.com/l7mp/stunner-gateway-operator",
    "contact": "@stunner-py/maintainers",
}

TRAFFIC = (
    "needs a plain UDP proxy: the suite sends raw datagrams (DNS queries or echo requests) to "
    "the Gateway's address, and a TURN gateway relays only for TURN clients (RFC 8656 §2)"
)
HTTP = (
    "presumes HTTP/HTTPS listeners (supportedKinds HTTPRoute, Programmed=True): STUNner serves "
    "TURN only, and reports such listeners Accepted=False, reason UnsupportedProtocol"
)


@dataclass(frozen=True, slots=True)
class Expected:
    """Why ``test`` fails: only its subtests named in ``subtests`` may fail (every one of the
    test's subtests, and the test itself, when ``subtests`` is None)."""

    reason: str
    subtests: frozenset[str] | None = None


def _traffic(*subtests: str) -> Expected:
    return Expected(TRAFFIC, frozenset(subtests))


KNOWN_FAILURES: Mapping[str, Expected] = {
    "UDPRoute": _traffic("Simple_UDP_request_matching_UDPRoute_should_reach_coredns_backend"),
    "UDPRouteWeightedRouting": _traffic(
        "UDP_traffic_should_be_distributed_across_the_weighted_backends"
    ),
    "UDPRouteMultipleRoutesAttachment": _traffic("Only_the_oldest_UDPRoute_should_receive_traffic"),
    "UDPRouteReferenceGrant": _traffic(
        "UDP_echo_request_reaches_the_cross-namespace_backend_while_the_ReferenceGrant_exists"
    ),
    "UDPRouteParentRefAttachAllListeners": _traffic(
        "UDP_echo_via_listener_udp-1_reaches_the_backend",
        "UDP_echo_via_listener_udp-2_reaches_the_backend",
        "UDP_echo_via_listener_udp-3_reaches_the_backend",
    ),
    "UDPRouteParentRefPortAndSectionName": Expected(
        TRAFFIC,  # each scenario checks the route's parents first (they match), then echoes
        frozenset(
            {
                "UDPRoute_attaches_to_a_UDP_listener_by_port",
                "UDPRoute_attaches_to_a_UDP_listener_by_sectionName",
                "UDPRoute_attaches_to_a_UDP_listener_by_sectionName_and_port",
            }
        ),
    ),
    "GatewayListenerUnsupportedProtocol": Expected(
        HTTP,  # its second subtest expects an HTTP listener Accepted
        frozenset(
            {
                "Gateway_with_at_least_one_accepted_listeners_should_be_accepted_and_the_"
                "listeners_should_have_the_Accepted_condition_set_accordingly"
            }
        ),
    ),
    "GatewayInvalidRouteKind": Expected(HTTP),
    "GatewayInvalidTLSConfiguration": Expected(HTTP),
    "GatewayModifyListeners": Expected(HTTP),
    "GatewaySecretInvalidReferenceGrant": Expected(HTTP),
    "GatewaySecretMissingReferenceGrant": Expected(HTTP),
    "GatewaySecretReferenceGrantAllInNamespace": Expected(HTTP),
    "GatewaySecretReferenceGrantSpecific": Expected(HTTP),
}


def conformance_objects() -> list[dict[str, Any]]:
    """Our GatewayClass for the suite, with its GatewayConfig. (The chart, installed with
    ``operator.enforceReferenceGrants``, lets the operator read ReferenceGrants.)"""
    return [
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": {"name": GATEWAY_CLASS, "namespace": NAMESPACE},
            "spec": {
                "realm": "stunner.l7mp.io",
                "authType": "static",
                "userName": "user-1",
                "password": "pass-1",
            },
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": GATEWAY_CLASS},
            "spec": {
                "controllerName": CONTROLLER_NAME,
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": GATEWAY_CLASS,
                    "namespace": NAMESPACE,
                },
            },
        },
    ]


class ClusterStandIns:
    """Scheduler, cloud load balancer and readiness exemptions for the suite's namespaces, in
    one owned thread that polls the API server until ``stop``."""

    def __init__(self, client: KubeClient, *, interval_s: float = 0.3) -> None:
        self.client = client
        self.interval_s = interval_s
        self.addresses: dict[tuple[str, str], str] = {}
        self.exempted: set[tuple[str, str]] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conformance-stand-ins")

    def start(self) -> ClusterStandIns:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for ns in NAMESPACES:
                try:
                    self.step(ns)
                except (KubeError, OSError, httpx.HTTPError) as err:  # races with its cleanup
                    log.debug("stand-ins in %s: %s", ns, err)
                except Exception as err:  # kept for the test to report
                    self.errors.append(f"{ns}: {err!r}")

    def step(self, ns: str) -> None:
        self.bind_pods(ns)
        self.assign_addresses(ns)
        self.exempt_unservable_gateways(ns)

    def bind_pods(self, ns: str) -> None:
        for pod in self.client.list("v1", "Pod", ns):
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            name = pod["metadata"]["name"]
            self.client.request(
                "POST",
                f"/api/v1/namespaces/{ns}/pods/{name}/binding",
                body={
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name, "namespace": ns},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
                },
                ok=(409,),
            )

    def assign_addresses(self, ns: str) -> None:
        for svc in self.client.list("v1", "Service", ns):
            if svc["spec"].get("type") != "LoadBalancer":
                continue
            if (svc.get("status", {}).get("loadBalancer") or {}).get("ingress"):
                continue
            key = (ns, svc["metadata"]["name"])
            address = self.addresses.setdefault(key, f"127.0.1.{len(self.addresses) % 250 + 1}")
            self.client.patch_status(
                "v1", "Service", key[1], ns, {"loadBalancer": {"ingress": [{"ip": address}]}}
            )

    def exempt_unservable_gateways(self, ns: str) -> None:
        for gw in self.client.list("gateway.networking.k8s.io/v1", "Gateway", ns):
            meta = gw["metadata"]
            if (meta.get("annotations") or {}).get(SKIP_READINESS) == "true":
                continue
            listeners = gw["spec"].get("listeners") or []
            if any(ls.get("protocol", "").upper() in SERVED_PROTOCOLS for ls in listeners):
                continue
            self.client.request(
                "PATCH",
                f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/gateways/{meta['name']}",
                body={"metadata": {"annotations": {SKIP_READINESS: "true"}}},
                content_type="application/merge-patch+json",
            )
            self.exempted.add((ns, meta["name"]))


@dataclass(frozen=True, slots=True)
class SuiteRun:
    returncode: int
    results: dict[str, str]
    """``Test`` or ``Test/Subtest`` (names as ``go test -v`` prints them) -> PASS/FAIL/SKIP."""
    report: Path
    log: Path
    seconds: float
    exempted: frozenset[tuple[str, str]]


_RESULT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): TestConformance/(\S+)", re.M)


def parse_results(text: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in _RESULT.finditer(text)}


def suite_arguments(
    report: Path, version: str, implementation: Mapping[str, str] = IMPLEMENTATION
) -> list[str]:
    overrides = ";".join(f"{k}:{v}" for k, v in TIMEOUTS.items())
    return [
        "-test.run",
        "^TestConformance$",
        "-test.v",
        f"-test.timeout={int(RUN_TIMEOUT_S)}s",
        f"--gateway-class={GATEWAY_CLASS}",
        f"--conformance-profiles={PROFILE}",
        f"--report-output={report}",
        f"--organization={implementation['organization']}",
        f"--project={implementation['project']}",
        f"--url={implementation['url']}",
        f"--version={version}",
        f"--contact={implementation['contact']}",
        f"--timeout-config-overrides={overrides}",
    ]


def operator_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "v" + version("stunner-operator")
    except PackageNotFoundError:
        return "v0.0.0-dev"


def run_suite(
    stack: KubeStack,
    stand_ins: ClusterStandIns,
    out_dir: Path,
    *,
    arguments: list[str] | None = None,
    report_name: str = REPORT_NAME,
) -> SuiteRun:
    """Run the suite against ``stack`` (with ``stand_ins`` running) and collect its results.
    ``arguments``: the suite's arguments for ``report_name`` (default: ours)."""
    binary = gobin.gateway_api_conformance() / "conformance.test"
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / report_name
    log_path = out_dir / LOG_NAME
    env = {**os.environ, "KUBECONFIG": str(stack.cluster.admin_kubeconfig), "HOME": str(out_dir)}
    started = time.monotonic()
    with open(log_path, "w") as out:
        done = subprocess.run(
            [str(binary), *(arguments or suite_arguments(report, operator_version()))],
            cwd=out_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S + 60.0,
            check=False,
        )
    seconds = time.monotonic() - started
    return SuiteRun(
        done.returncode,
        parse_results(log_path.read_text()),
        report,
        log_path,
        seconds,
        frozenset(stand_ins.exempted),
    )


def unexpected(results: Mapping[str, str]) -> list[str]:
    """Every failure ``KNOWN_FAILURES`` does not explain, and every test it names that did not
    run; empty when the run is as documented."""
    problems = []
    tops = {name for name in results if "/" not in name}
    for name, outcome in sorted(results.items()):
        if outcome != "FAIL":
            continue
        top, _, sub = name.partition("/")
        expected = KNOWN_FAILURES.get(top)
        if expected is None:
            problems.append(f"{name} failed")
        elif sub and expected.subtests is not None and sub.split("/")[0] not in expected.subtests:
            problems.append(f"{name} failed, but only {sorted(expected.subtests)} may")
        elif not sub and expected.subtests is not None:
            failed_subs = [n for n, o in results.items() if n.startswith(top + "/") and o == "FAIL"]
            if not failed_subs:
                problems.append(f"{name} failed outside its subtests")
    problems.extend(f"{name} did not run" for name in sorted(set(KNOWN_FAILURES) - tops))
    problems.extend(
        f"{name} passes now: drop it from KNOWN_FAILURES"
        for name in sorted(KNOWN_FAILURES)
        if results.get(name) == "PASS"
    )
    return problems


def install_standard_udproute(client: KubeClient) -> None:
    """The standard channel's UDPRoute CRD in place of the experimental one the stack installs
    (both store v1): with one channel throughout, the suite stamps its report with the API
    version and channel instead of UNDEFINED (``--allow-crds-mismatch``)."""
    crd_dir = gobin.module_dir(gobin.GATEWAY_API, gobin.GATEWAY_API_VERSION) / "config" / "crd"
    path = crd_dir / "standard" / "gateway.networking.k8s.io_udproutes.yaml"
    (crd,) = load_documents(path.read_text())
    client.apply(crd)
    client.wait_established([crd["metadata"]["name"]])


FEATURES = ("Gateway", "ReferenceGrant", "UDPRoute")


def class_accepted(client: KubeClient) -> bool:
    gwc = client.get("gateway.networking.k8s.io/v1", "GatewayClass", GATEWAY_CLASS) or {}
    return any(
        c.get("type") == "Accepted" and c.get("status") == "True"
        for c in (gwc.get("status") or {}).get("conditions") or []
    )


def class_features(client: KubeClient) -> set[str]:
    gwc = client.get("gateway.networking.k8s.io/v1", "GatewayClass", GATEWAY_CLASS) or {}
    return {f["name"] for f in (gwc.get("status") or {}).get("supportedFeatures") or []}


def our_stack(workdir: Path) -> KubeStack:
    """The stack with our operator, ReferenceGrants enforced."""
    return KubeStack(
        workdir,
        apiserver_args=APISERVER_ARGS,
        operator_env=OPERATOR_ENV,
        chart_values={"operator": {"enforceReferenceGrants": True}},
    )


StackFactory = Callable[[Path], KubeStack]
"""The hook for running the suite against upstream's operator: a factory whose stack runs
upstream's operator (same controller name, and an API server with ``APISERVER_ARGS``) instead
of ours; that operator's failures then need their own ``KNOWN_FAILURES``."""


@contextlib.contextmanager
def conformance_cluster(
    workdir: Path,
    stack_factory: StackFactory = our_stack,
    *,
    objects: Callable[[], list[dict[str, Any]]] = conformance_objects,
    publishes_features: bool = True,
    standard_udproute: bool = True,
) -> Iterator[tuple[KubeStack, KwokNode, ClusterStandIns]]:
    """The stack, the GatewayClass for the suite (``objects``), a kwok node and the stand-ins.
    ``publishes_features``: wait for the class's supportedFeatures (an operator that publishes
    none gets them on the suite's command line instead). ``standard_udproute``: replace the
    experimental UDPRoute CRD with the standard one (an operator that watches v1alpha2
    UDPRoutes needs the experimental one)."""
    stack = stack_factory(workdir)
    try:
        stack.start()
        client = stack.admin
        if standard_udproute:
            install_standard_udproute(client)
        client.apply_all(objects())
        # The suite reads the features to test from the class status (GEP-2162) at its start.
        if publishes_features:
            client.wait_for(
                "the GatewayClass's supportedFeatures",
                lambda: class_features(client) >= set(FEATURES),
                timeout_s=60.0,
            )
        else:
            client.wait_for(
                "the GatewayClass Accepted",
                lambda: class_accepted(client),
                timeout_s=60.0,
            )
        cluster = stack.cluster
        assert cluster.pki is not None
        with kwok_node(
            client,
            workdir / "kwok",
            server=cluster.server,
            ca_cert=cluster.pki.ca_cert,
            admin_cert=(cluster.pki.admin_cert, cluster.pki.admin_key),
        ) as node:
            node.start()
            stand_ins = ClusterStandIns(client).start()
            try:
                yield stack, node, stand_ins
            finally:
                stand_ins.stop()
    finally:
        stack.stop()


UPSTREAM_REPORT_NAME = "gateway-udp-report-upstream.yaml"
UPSTREAM_IMPLEMENTATION = {
    "organization": "l7mp",
    "project": "stunner-gateway-operator",
    "url": "https://github.com/l7mp/stunner-gateway-operator",
    "contact": "@l7mp/stunner-maintainers",
}


class UpstreamStack(KubeStack):
    """Upstream's stunner-gateway-operator (``gobin.UPSTREAM_OPERATOR_VERSION``) on the same
    kind of API server (``APISERVER_ARGS``), started as ``conformance.sides.UpstreamSide``
    starts it: the Gateway API release, upstream's CRDs, the operator as a local process with
    the admin kubeconfig. No chart, Redis or CDS of ours; ReferenceGrants are not enforced
    (upstream has no such option)."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, apiserver_args=APISERVER_ARGS)
        from conformance.sides import UpstreamSide

        self.side = UpstreamSide(workdir / "upstream")
        self.side.cluster = self.cluster

    def start(self) -> KubeStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.side.start()
        return self

    def stop(self) -> None:
        self.side.stop()


def upstream_objects() -> list[dict[str, Any]]:
    """Upstream's GatewayClass for the suite: our objects (same class name, same controller
    name), plus the namespace of the GatewayConfig and the Dataplane ``default`` upstream
    renders its Deployments from (our chart installs both for ours)."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "Dataplane",
            "metadata": {"name": "default"},
            "spec": {
                "image": f"docker.io/l7mp/stunnerd:{gobin.UPSTREAM_OPERATOR_VERSION}",
                "command": ["stunnerd"],
                "args": ["-w"],
            },
        },
        *conformance_objects(),
    ]


def upstream_arguments(report: Path) -> list[str]:
    """The suite's arguments for upstream: its GatewayClass publishes no supportedFeatures, so
    the profile's features come on the command line; it watches v1alpha2 UDPRoutes, so the
    experimental UDPRoute CRD stays beside the standard channel's other CRDs
    (``--allow-crds-mismatch``)."""
    return [
        *suite_arguments(report, gobin.UPSTREAM_OPERATOR_VERSION, UPSTREAM_IMPLEMENTATION),
        f"--supported-features={','.join(FEATURES)}",
        "--allow-crds-mismatch",
    ]


UPSTREAM_BEGIN = "<!-- upstream:begin (python -m support.gwapi_conformance --operator upstream) -->"
UPSTREAM_END = "<!-- upstream:end -->"

UPSTREAM_NOT_PROGRAMMED = (
    "upstream: no Programmed condition on a UDP listener (the suite waits for Programmed=True)"
)
UPSTREAM_REASONS: Mapping[str, str] = {
    "GatewayClassObservedGenerationBump": (
        "upstream: the test's GatewayClass (no parametersRef) is never Accepted"
    ),
    "GatewayClassObservedGenerationBump/observedGeneration_should_increment": (
        "upstream: the test's GatewayClass (no parametersRef) is never Accepted"
    ),
    "UDPRouteInvalidCrossNamespaceBackendRef": UPSTREAM_NOT_PROGRAMMED,
    "UDPRouteMultipleRoutesAttachment": UPSTREAM_NOT_PROGRAMMED,
    "UDPRouteReferenceGrant": UPSTREAM_NOT_PROGRAMMED,
    "UDPRouteWeightedRouting": UPSTREAM_NOT_PROGRAMMED,
    "UDPRoute": UPSTREAM_NOT_PROGRAMMED,
    "UDPRoute/Simple_UDP_request_matching_UDPRoute_should_reach_coredns_backend": (
        UPSTREAM_NOT_PROGRAMMED
    ),
}
"""Why upstream's result differs from ours, by ``Test`` or ``Test/Subtest``."""

_ROW = re.compile(r"^\| (.+?) \| (PASS|FAIL|SKIP) \| (.*?) ?\|$")


def _display(name: str) -> tuple[str, str]:
    top, _, sub = name.partition("/")
    return top, sub.replace("_", " ")


def published_results(readme: str) -> dict[tuple[str, str], tuple[str, str]]:
    """Our results as the README's results table shows them: ``(test, subtest)`` -> (result,
    reason); subtest "" for the test itself."""
    _, _, rest = readme.partition(RESULTS_BEGIN)
    block, _, _ = rest.partition(RESULTS_END)
    out: dict[tuple[str, str], tuple[str, str]] = {}
    top = ""
    for line in block.splitlines():
        m = _ROW.match(line.strip())
        if not m:
            continue
        shown, outcome, reason = m.groups()
        if shown.startswith("**"):
            top, sub = shown.strip("*"), ""
        else:
            sub = shown.split("↳ ", 1)[-1]
        out[(top, sub)] = (outcome, reason.strip())
    return out


def side_by_side(ours: Mapping[tuple[str, str], tuple[str, str]], run: SuiteRun) -> str:
    upstream = {_display(n): (o, n) for n, o in run.results.items() if o != "SKIP"}
    lines = [
        f"Upstream's suite run: {len(upstream)} tests and subtests ran in {run.seconds:.0f}s "
        f"(exit status {run.returncode}).",
        "",
        "| Test | Ours | Upstream v1.2.1 | Reason |",
        "| --- | --- | --- | --- |",
    ]
    for key in sorted(set(ours) | set(upstream)):
        top, sub = key
        our, our_reason = ours.get(key, ("—", ""))
        theirs, name = upstream.get(key, ("—", f"{top}/{sub}" if sub else top))
        reason = UPSTREAM_REASONS.get(name.replace(" ", "_"), "")
        if not reason and "FAIL" in (our, theirs):
            reason = our_reason
        shown = f"&nbsp;&nbsp;↳ {sub}" if sub else f"**{top}**"
        lines.append(f"| {shown} | {our} | {theirs} | {reason} |")
    return "\n".join(lines)


def write_upstream_docs(run: SuiteRun, docs: Path) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    readme = docs / "README.md"
    text = readme.read_text() if readme.exists() else ""
    if run.report.exists():
        shutil.copyfile(run.report, docs / UPSTREAM_REPORT_NAME)
        table = side_by_side(published_results(text), run)
    else:
        table = f"Upstream's suite run wrote no report (exit status {run.returncode})."
    if UPSTREAM_BEGIN not in text:
        text += f"\n{UPSTREAM_BEGIN}\n{UPSTREAM_END}\n"
    head, _, rest = text.partition(UPSTREAM_BEGIN)
    _, _, tail = rest.partition(UPSTREAM_END)
    readme.write_text(f"{head}{UPSTREAM_BEGIN}\n{table}\n{UPSTREAM_END}{tail}")


def run_upstream(out: Path, workdir: Path) -> int:
    """The suite against upstream's operator: its report and the side-by-side table. Exits 0
    whatever the results (they are reported, not judged)."""
    with conformance_cluster(
        workdir,
        UpstreamStack,
        objects=upstream_objects,
        publishes_features=False,
        standard_udproute=False,
    ) as (stack, _node, stand_ins):
        suite = workdir / "suite"
        run = run_suite(
            stack,
            stand_ins,
            suite,
            arguments=upstream_arguments(suite / UPSTREAM_REPORT_NAME),
            report_name=UPSTREAM_REPORT_NAME,
        )
    write_upstream_docs(run, out)
    failed = sorted(n for n, o in run.results.items() if o == "FAIL")
    print(f"upstream: {len(run.results)} results in {run.seconds:.0f}s, {len(failed)} failed")
    print(f"report and side-by-side table in {out}")
    return 0


RESULTS_BEGIN = "<!-- results:begin (python -m support.gwapi_conformance writes this) -->"
RESULTS_END = "<!-- results:end -->"


SHORT_REASONS = {
    TRAFFIC: "traffic: needs a plain UDP proxy",
    HTTP: "presumes HTTP/HTTPS listeners",
}
"""The reasons as the README's table cites them (its section "Why tests fail" explains each)."""


def results_table(run: SuiteRun) -> str:
    ran = {n: o for n, o in run.results.items() if o != "SKIP"}
    skipped = len(run.results) - len(ran)
    lines = [
        f"Suite run: {len(ran)} tests and subtests ran in {run.seconds:.0f}s (exit status "
        f"{run.returncode}); {skipped} tests outside the profile were skipped by the suite.",
        "",
        "| Test | Result | Reason |",
        "| --- | --- | --- |",
    ]
    for name, outcome in sorted(ran.items()):
        top, _, sub = name.partition("/")
        reason = ""
        expected = KNOWN_FAILURES.get(top)
        if outcome == "FAIL" and expected is not None:
            reason = SHORT_REASONS.get(expected.reason, expected.reason)
        shown = f"&nbsp;&nbsp;↳ {sub.replace('_', ' ')}" if sub else f"**{top}**"
        lines.append(f"| {shown} | {outcome} | {reason} |")
    return "\n".join(lines)


def write_docs(run: SuiteRun, docs: Path) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    if not run.report.exists():
        raise SystemExit(f"the suite wrote no report; see {run.log}")
    shutil.copyfile(run.report, docs / REPORT_NAME)
    readme = docs / "README.md"
    text = readme.read_text() if readme.exists() else f"{RESULTS_BEGIN}\n{RESULTS_END}\n"
    head, _, rest = text.partition(RESULTS_BEGIN)
    _, _, tail = rest.partition(RESULTS_END)
    readme.write_text(f"{head}{RESULTS_BEGIN}\n{results_table(run)}\n{RESULTS_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gwapi_conformance", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=gobin.REPO / "docs" / "conformance")
    parser.add_argument("--workdir", type=Path, default=gobin.REPO / ".run" / "gwapi-conformance")
    parser.add_argument(
        "--operator",
        choices=("ours", "upstream"),
        default="ours",
        help="upstream: upstream's stunner-gateway-operator (report and side-by-side table)",
    )
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    if args.operator == "upstream":
        workdir = workdir.with_name(workdir.name + "-upstream")
        shutil.rmtree(workdir, ignore_errors=True)
        return run_upstream(args.out.resolve(), workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    with conformance_cluster(workdir) as (stack, _node, stand_ins):
        run = run_suite(stack, stand_ins, workdir / "suite")
    write_docs(run, args.out.resolve())
    problems = unexpected(run.results)
    for line in problems:
        print(f"unexpected: {line}", file=sys.stderr)
    print(f"{len(run.results)} results in {run.seconds:.0f}s; report in {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
