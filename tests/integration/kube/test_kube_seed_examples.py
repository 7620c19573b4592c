"""Every seed example through a real API server, the operator running as the chart's account.

Each example of GATEWAY.md and GATEWAY-v1alpha1.md (tests/fixtures/operator/seeds) is applied
unchanged, on top of the objects the examples refer to (base.yaml), to a real kube-apiserver
holding the official Gateway API CRDs and the chart's own. The API server must accept every
object; the operator, talking to it as ServiceAccount stunner-operator, must write the statuses
and the stunnerd configs of the example's golden file (the renderer's output for that example,
tests/fixtures/operator/golden): the real server's schema validation, defaulting, status
subresources and RBAC all stand between the YAML and the outcome here.

Two examples (GATEWAY-03 and -04) write an annotation as a bare YAML boolean
(``stunner.l7mp.io/enable-mixed-protocol-lb: true``). Annotations are strings, and a real API
server refuses the object, as kubectl would; the operator's local mode reads it as the string
"true". The v1alpha1 documents write GatewayClass and Gateway as gateway.networking.k8s.io
v1alpha2, which Gateway API releases stopped serving long ago, and one of their Gateway API
UDPRoutes names a Service backend without a port, which Gateway API's own validation refuses
(STUNner does not read that port). The test pins each refusal,
then applies the example as a user must (the value quoted; v1; the Service's port), and
docs/real-cluster.md lists
these with the other findings of the real server.

What a cluster's other controllers do is done by the test: the base's LoadBalancer Service is
the operator's to create, and its load-balancer address is then written to its status, as a
cloud provider's controller would.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

import pytest
import yaml

from stunner_common.config import StunnerConfig
from support.kube import KubeClient, KubeError
from support.kube_stack import KubeStack
from support.operator import FIXTURES

SEEDS = FIXTURES / "seeds"
GOLDEN = FIXTURES / "golden"
CASES = sorted(p.stem for p in SEEDS.glob("GATEWAY*.yaml"))
STATUS_KINDS = {
    "Gateway": ("gateway.networking.k8s.io/v1", "Gateway"),
    "GatewayClass": ("gateway.networking.k8s.io/v1", "GatewayClass"),
    "UDPRoute": ("stunner.l7mp.io/v1", "UDPRoute"),
    "UDPRouteV1A2": ("gateway.networking.k8s.io/v1", "UDPRoute"),
}


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _key(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    group = doc["apiVersion"].rpartition("/")[0]
    return (group, doc["kind"], meta.get("namespace", ""), meta["name"])


BASE = _docs((SEEDS / "base.yaml").read_text())
# Versions of the v1alpha1 documents that today's Gateway API release no longer serves; the
# same objects apply as gateway.networking.k8s.io/v1.
RETIRED = {"gateway.networking.k8s.io/v1alpha2": {"GatewayClass", "Gateway"}}


def _with_backend_ports(doc: dict[str, Any]) -> dict[str, Any] | None:
    """A Gateway API route whose Service backends lack a port, with the Service's port added
    (the Gateway API's own validation requires one; STUNner does not read it)."""
    if (
        doc["apiVersion"].partition("/")[0] != "gateway.networking.k8s.io"
        or doc["kind"] != "UDPRoute"
    ):
        return None
    ports = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]["ports"][0]["port"]
        for d in BASE
        if d["kind"] == "Service" and d["spec"].get("ports")
    }
    fixed = json.loads(json.dumps(doc))
    changed = False
    for rule in fixed["spec"].get("rules", []):
        for ref in rule.get("backendRefs", []):
            if ref.get("kind", "Service") == "Service" and "port" not in ref:
                ns = ref.get("namespace", doc["metadata"].get("namespace", "default"))
                ref["port"] = ports[(ns, ref["name"])]
                changed = True
    return fixed if changed else None


def _unquoted_annotations(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The document with non-string annotation values quoted, or None if it has none."""
    annotations = doc.get("metadata", {}).get("annotations") or {}
    if all(isinstance(v, str) for v in annotations.values()):
        return None
    fixed = {k: v if isinstance(v, str) else json.dumps(v) for k, v in annotations.items()}
    return {**doc, "metadata": {**doc["metadata"], "annotations": fixed}}


def _apply(client: KubeClient, doc: dict[str, Any]) -> None:
    """Apply as a user would; a status in the manifest is another controller's: patch it."""
    if doc["metadata"].get("ownerReferences"):
        return  # the operator's own object: it creates it
    body = {k: v for k, v in doc.items() if k != "status"}
    # A uid is the server's to give (the fixtures fix one for the golden renders).
    body["metadata"] = {k: v for k, v in doc["metadata"].items() if k != "uid"}
    client.apply(body)
    if "status" in doc:
        client.patch_status(
            doc["apiVersion"], doc["kind"], doc["metadata"]["name"],
            doc["metadata"].get("namespace"), doc["status"],
        )  # fmt: skip


def _operator_object_statuses(client: KubeClient) -> None:
    """The load-balancer address of the base's operator-owned Services, once they exist."""
    for doc in BASE:
        if doc["kind"] == "Service" and doc["metadata"].get("ownerReferences") and "status" in doc:
            meta = doc["metadata"]
            if client.get("v1", "Service", meta["name"], meta["namespace"]) is not None:
                client.patch_status("v1", "Service", meta["name"], meta["namespace"], doc["status"])


PARENT_DEFAULTS = {"group": "gateway.networking.k8s.io", "kind": "Gateway"}


def _without_generations(value: Any) -> Any:
    """A status without what only a server adds: generations, times, and the parentRef
    defaults the CRD schema fills into a route's spec (which its status repeats)."""
    if isinstance(value, dict):
        return {
            k: _without_generations(v)
            for k, v in value.items()
            if k not in {"observedGeneration", "lastTransitionTime"}
            and not (k in PARENT_DEFAULTS and v == PARENT_DEFAULTS[k] and "name" in value)
        }
    if isinstance(value, list):
        return [_without_generations(v) for v in value]
    return value


def _node_external_ip() -> str:
    for doc in BASE:
        if doc["kind"] == "Node":
            for address in doc["status"]["addresses"]:
                if address["type"] == "ExternalIP":
                    return str(address["address"])
    raise AssertionError("base.yaml has no Node with an ExternalIP")


def _with_cluster_feedback(
    client: KubeClient, statuses: dict[str, Any], configs: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The golden outcome once the cluster has answered the operator.

    A render without a cluster cannot know a Service's node ports; the golden file shows a
    Gateway whose Service has no load-balancer address "waiting for a public address". In a
    cluster the API server assigns node ports (NodePort and LoadBalancer Services alike), and
    the operator then advertises the node's ExternalIP with each listener's node port and marks
    the Gateway Programmed.
    """
    statuses, configs = json.loads(json.dumps(statuses)), json.loads(json.dumps(configs))
    for label, status in statuses.items():
        kind, _, name = label.partition(" ")
        waiting = [c for c in status.get("conditions", []) if c["reason"] == "AddressNotAssigned"]
        if kind != "Gateway" or not waiting:
            continue
        ns, _, gw = name.partition("/")
        service = client.get("v1", "Service", gw, ns)
        if service is None or service["spec"]["type"] not in {"NodePort", "LoadBalancer"}:
            continue
        ip = _node_external_ip()
        status["addresses"] = [{"type": "IPAddress", "value": ip}]
        waiting[0].update(
            message="dataplane configuration successfully rendered",
            reason="Programmed",
            status="True",
        )
        node_ports = {p["name"]: p.get("nodePort", 0) for p in service["spec"]["ports"]}
        for listener in configs[name]["listeners"]:
            listener["public_address"] = ip
            listener["public_port"] = node_ports[listener["name"].rsplit("/", 1)[1]]
    return statuses, configs


def _diff(want: Any, got: Any) -> str:
    a, b = (json.dumps(x, indent=1, sort_keys=True).splitlines() for x in (want, got))
    return "\n".join(difflib.unified_diff(a, b, "golden", "cluster", lineterm="", n=2))


def _canonical(configs: dict[str, Any]) -> dict[str, Any]:
    return {
        k: json.loads(StunnerConfig.model_validate(v).canonical_json()) for k, v in configs.items()
    }


def _statuses(client: KubeClient, golden: dict[str, Any]) -> dict[str, Any]:
    got = {}
    for label in golden:
        kind, _, name = label.partition(" ")
        ns, _, obj_name = name.rpartition("/")
        api_version, real_kind = STATUS_KINDS[kind]
        obj = client.get(api_version, real_kind, obj_name, ns or None)
        got[label] = _without_generations((obj or {}).get("status"))
    return got


@pytest.fixture(scope="module")
def seeded(stack: KubeStack) -> KubeStack:
    for doc in BASE:
        if doc["kind"] == "Namespace":
            stack.admin.apply(doc)
    for doc in BASE:
        _apply(stack.admin, doc)
    return stack


@pytest.mark.parametrize("case", CASES)
def test_seed_example_is_accepted_and_gets_its_golden_statuses_and_configs(
    seeded: KubeStack, case: str
) -> None:
    client = seeded.admin
    example = _docs((SEEDS / f"{case}.yaml").read_text())
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    want_statuses = _without_generations(golden["statuses"])
    want_configs = _canonical(golden["configs"])
    base_by_key = {_key(d): d for d in BASE}
    for doc in example:
        quoted = _unquoted_annotations(doc)
        if quoted is not None:
            with pytest.raises(KubeError, match=r"annotations.*expected string"):
                _apply(client, doc)
            doc = quoted
        if doc["apiVersion"] in RETIRED and doc["kind"] in RETIRED[doc["apiVersion"]]:
            with pytest.raises(KubeError, match="serves no"):
                _apply(client, doc)
            doc = {**doc, "apiVersion": "gateway.networking.k8s.io/v1"}
        portless = _with_backend_ports(doc)
        if portless is not None:
            with pytest.raises(KubeError, match="Must have port for Service reference"):
                _apply(client, doc)
            doc = portless
        _apply(client, doc)  # a refusal raises KubeError with the API server's message
    try:

        def converged() -> bool:
            nonlocal want_statuses, want_configs
            _operator_object_statuses(client)
            want_statuses, want_configs = _with_cluster_feedback(
                client, want_statuses, want_configs
            )
            return (
                _statuses(client, want_statuses) == want_statuses
                and _canonical(seeded.cds_configs()) == want_configs
            )

        try:
            client.wait_for(f"{case}: golden statuses and configs", converged, timeout_s=30.0)
        except TimeoutError:
            got = {"statuses": _statuses(client, want_statuses)}
            got["configs"] = _canonical(seeded.cds_configs())
            want = {"statuses": want_statuses, "configs": want_configs}
            pytest.fail(f"{case}: the cluster differs from the golden render:\n{_diff(want, got)}")
    finally:
        # Back to the base: what the example added goes, what it replaced comes back.
        for doc in reversed(example):
            key = _key(doc)
            if key in base_by_key:
                _apply(client, base_by_key[key])
            else:
                client.delete(
                    doc["apiVersion"], doc["kind"], doc["metadata"]["name"],
                    doc["metadata"].get("namespace", "default")
                    if client.resource(doc["apiVersion"], doc["kind"]).namespaced
                    else None,
                )  # fmt: skip
