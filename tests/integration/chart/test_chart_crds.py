"""The chart's stunner.l7mp.io CRDs: well-formed, structural, and matching the user documentation.

The examples of GATEWAY.md must be accepted unchanged, the defaults the documentation promises
must be what the API server fills in, and objects the documentation rules out must be refused
with an error that names the field.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chart_support import (
    EXAMPLES_FILE,
    chart_crds,
    crd_version_schema,
    custom_resource_errors,
    load_documents,
    seed_documents,
    structural_problems,
    stunner_examples_in_markdown,
    validate_builtin,
    with_defaults,
)

from stunner_common.crds import gateway_api, stunner

pytestmark = pytest.mark.integration

EXPECTED = {
    "gatewayconfigs.stunner.l7mp.io": ("GatewayConfig", "Namespaced", ["gwconf"]),
    "dataplanes.stunner.l7mp.io": ("Dataplane", "Cluster", ["dps"]),
    "staticservices.stunner.l7mp.io": ("StaticService", "Namespaced", ["ssvc"]),
    "udproutes.stunner.l7mp.io": ("UDPRoute", "Namespaced", []),
}

CRDS = chart_crds()
EXAMPLES = load_documents(EXAMPLES_FILE.read_text())


def _crd(kind: str) -> dict[str, Any]:
    return next(c for c in CRDS if c["spec"]["names"]["kind"] == kind)


def test_helm_installs_exactly_the_four_stunner_crds() -> None:
    assert sorted(c["metadata"]["name"] for c in CRDS) == sorted(EXPECTED)
    for crd in CRDS:
        kind, scope, short = EXPECTED[crd["metadata"]["name"]]
        spec = crd["spec"]
        assert spec["group"] == "stunner.l7mp.io"
        assert crd["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
        assert spec["names"]["kind"] == kind
        assert spec["scope"] == scope
        assert spec["names"].get("shortNames", []) == short
        assert "stunner" in spec["names"]["categories"]


def test_every_crd_stores_v1_and_serves_it() -> None:
    for crd in CRDS:
        versions = crd["spec"]["versions"]
        assert [v["name"] for v in versions if v["storage"]] == ["v1"], crd["metadata"]["name"]
        assert all(v["served"] for v in versions)


@pytest.mark.parametrize("crd", CRDS, ids=lambda c: c["metadata"]["name"])
def test_crd_is_a_valid_apiextensions_v1_object(crd: dict[str, Any]) -> None:
    assert validate_builtin(crd) == []


@pytest.mark.parametrize(
    ("crd", "version"),
    [(c, v["name"]) for c in CRDS for v in c["spec"]["versions"]],
    ids=lambda x: x["metadata"]["name"] if isinstance(x, dict) else x,
)
def test_crd_schema_is_structural_with_valid_defaults(crd: dict[str, Any], version: str) -> None:
    assert list(structural_problems(crd_version_schema(crd, version))) == []


@pytest.mark.parametrize(
    "example",
    EXAMPLES,
    ids=lambda e: f"{e['apiVersion'].rsplit('/', 1)[1]}-{e['kind']}-{e['metadata']['name']}",
)
def test_crds_accept_the_documented_example(example: dict[str, Any]) -> None:
    assert custom_resource_errors(example, CRDS) == []


def test_documented_examples_cover_every_kind_and_both_versions() -> None:
    seen = {(e["apiVersion"], e["kind"]) for e in EXAMPLES}
    for kind in ("GatewayConfig", "Dataplane", "StaticService", "UDPRoute"):
        assert ("stunner.l7mp.io/v1", kind) in seen
    assert ("stunner.l7mp.io/v1alpha1", "GatewayConfig") in seen


def test_vendored_examples_are_those_of_the_documentation() -> None:
    docs = seed_documents()
    if not docs:
        pytest.skip("the shared seed documents (GATEWAY.md) are not beside this checkout")
    from_docs = [obj for doc in docs for obj in stunner_examples_in_markdown(doc.read_text())]
    assert from_docs == EXAMPLES


def _defaulted(text: str) -> dict[str, Any]:
    obj = yaml.safe_load(text)
    version = obj["apiVersion"].rsplit("/", 1)[1]
    schema = crd_version_schema(_crd(obj["kind"]), version)
    assert custom_resource_errors(obj, CRDS) == []
    out: dict[str, Any] = with_defaults(obj, schema)
    return out


DEFAULTS = [
    # GATEWAY.md: dataplane "default", realm stunner.l7mp.io, authType static.
    (
        "apiVersion: stunner.l7mp.io/v1\nkind: GatewayConfig\nmetadata: {name: g, namespace: s}\n"
        "spec: {userName: u, password: p}",
        {"dataplane": "default", "realm": "stunner.l7mp.io", "authType": "static"},
    ),
    (
        "apiVersion: stunner.l7mp.io/v1alpha1\nkind: GatewayConfig\n"
        "metadata: {name: g, namespace: s}\nspec: {}",
        {"stunnerConfig": "stunnerd-config", "realm": "stunner.l7mp.io", "authType": "plaintext"},
    ),
    (
        "apiVersion: stunner.l7mp.io/v1\nkind: Dataplane\nmetadata: {name: d}\n"
        "spec: {image: 'stunnerd:1'}",
        {"dataplaneResource": "Deployment", "offloadEngine": "None"},
    ),
]


@pytest.mark.parametrize(("text", "expected"), DEFAULTS)
def test_defaults_are_the_documented_ones(text: str, expected: dict[str, Any]) -> None:
    spec = _defaulted(text)["spec"]
    assert {k: spec[k] for k in expected} == expected


def test_backend_refs_default_to_a_core_service_and_parents_to_a_gateway() -> None:
    route = _defaulted(
        "apiVersion: stunner.l7mp.io/v1\nkind: UDPRoute\nmetadata: {name: r, namespace: s}\n"
        "spec: {parentRefs: [{name: gw}], rules: [{backendRefs: [{name: media}]}]}"
    )
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    parent = route["spec"]["parentRefs"][0]
    assert (backend["group"], backend["kind"]) == ("", "Service")
    assert (parent["group"], parent["kind"]) == ("gateway.networking.k8s.io", "Gateway")
    assert "port" not in backend
    assert "endPort" not in backend


GC = "apiVersion: stunner.l7mp.io/v1\nkind: GatewayConfig\nmetadata: {name: g, namespace: s}\n"
ROUTE = "apiVersion: stunner.l7mp.io/v1\nkind: UDPRoute\nmetadata: {name: r, namespace: s}\n"
DP = "apiVersion: stunner.l7mp.io/v1\nkind: Dataplane\nmetadata: {name: d}\n"
SSVC = "apiVersion: stunner.l7mp.io/v1\nkind: StaticService\nmetadata: {name: x, namespace: s}\n"

REFUSED = [
    ("realm-upper-case", GC + "spec: {realm: Stunner.L7mp.IO}", ".spec.realm"),
    ("realm-trailing-dash", GC + "spec: {realm: stunner-}", ".spec.realm"),
    ("auth-type-unknown", GC + "spec: {authType: kerberos}", ".spec.authType"),
    ("auth-type-prefix-only", GC + "spec: {authType: statical}", ".spec.authType"),
    ("user-name-with-space", GC + "spec: {userName: 'a b', password: p}", ".spec.userName"),
    ("misspelt-field", GC + "spec: {userNmae: u}", 'unknown field "userNmae"'),
    ("annotation-not-string", GC + "spec: {loadBalancerServiceAnnotations: {a: {b: c}}}", "a"),
    ("auth-ref-without-name", GC + "spec: {authRef: {namespace: s}}", ".spec.authRef.name"),
    ("route-without-rules", ROUTE + "spec: {parentRefs: [{name: gw}]}", ".spec.rules"),
    ("route-empty-rules", ROUTE + "spec: {rules: []}", "fewer than 1"),
    ("backend-without-name", ROUTE + "spec: {rules: [{backendRefs: [{kind: Service}]}]}", "name"),
    ("backend-port-zero", ROUTE + "spec: {rules: [{backendRefs: [{name: a, port: 0}]}]}", "port"),
    (
        "backend-end-port-too-big",
        ROUTE + "spec: {rules: [{backendRefs: [{name: a, port: 1, endPort: 70000}]}]}",
        "endPort",
    ),
    (
        "backend-port-not-a-number",
        ROUTE + "spec: {rules: [{backendRefs: [{name: a, port: eighty}]}]}",
        "expected integer",
    ),
    (
        "seventeen-backends",
        ROUTE + "spec: {rules: [{backendRefs: [" + ", ".join(["{name: a}"] * 17) + "]}]}",
        "more than 16",
    ),
    (
        "parent-namespace-invalid",
        ROUTE + "spec: {parentRefs: [{name: g, namespace: A_B}], "
        "rules: [{backendRefs: [{name: a}]}]}",
        "namespace",
    ),
    ("static-service-without-prefixes", SSVC + "spec: {}", ".spec.prefixes"),
    ("static-service-without-spec", SSVC, ".spec"),
    ("dataplane-without-image", DP + "spec: {replicas: 1}", ".spec.image"),
    ("dataplane-pull-policy", DP + "spec: {image: i, imagePullPolicy: Sometimes}", "Sometimes"),
    ("dataplane-offload-engine", DP + "spec: {image: i, offloadEngine: eBPF}", "offloadEngine"),
    ("dataplane-negative-replicas", DP + "spec: {image: i, replicas: -1}", "replicas"),
    ("dataplane-resource-kind", DP + "spec: {image: i, dataplaneResource: Pod}", "Pod"),
    (
        "dataplane-bad-quantity",
        DP + "spec: {image: i, resources: {limits: {cpu: two cores}}}",
        "limits.cpu",
    ),
    ("dataplane-host-network-string", DP + "spec: {image: i, hostNetwork: 'yes'}", "boolean"),
    (
        "dataplane-namespaced",
        "apiVersion: stunner.l7mp.io/v1\nkind: Dataplane\nmetadata: {name: d, namespace: x}\n"
        "spec: {image: i}",
        "cluster-scoped",
    ),
    ("version-not-served", GC.replace("/v1\n", "/v2\n") + "spec: {}", "not served"),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_crds_refuse_what_the_documentation_rules_out(text: str, fragment: str) -> None:
    errors = custom_resource_errors(yaml.safe_load(text), CRDS)
    assert errors, "the object was accepted"
    assert any(fragment in e for e in errors), errors


def _aliases(model: type[Any]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


@pytest.mark.parametrize(
    ("kind", "path", "model", "unused_by_operator", "not_in_crd"),
    [
        # v1alpha1 fields the v1 schemas keep, so a v1alpha1 object survives storage as v1
        # (the versions share one schema-less conversion), but v1 objects do not use:
        (
            "GatewayConfig",
            ("spec",),
            stunner.GatewayConfigSpec,
            {"stunnerConfig", "metricsEndpoint", "healthCheckEndpoint", "minPort", "maxPort"},
            set(),
        ),
        ("Dataplane", ("spec",), stunner.DataplaneSpec, {"healthCheckPort"}, set()),
        ("StaticService", ("spec",), stunner.StaticServiceSpec, {"ports"}, set()),
        ("UDPRoute", ("spec",), gateway_api.RouteSpec, set(), set()),
        ("UDPRoute", ("spec", "parentRefs", "[]"), gateway_api.ParentReference, set(), set()),
        ("UDPRoute", ("spec", "rules", "[]"), gateway_api.RouteRule, {"name"}, set()),
        (
            "UDPRoute",
            ("spec", "rules", "[]", "backendRefs", "[]"),
            gateway_api.BackendRef,
            set(),
            {"weight"},  # the shared Gateway API model knows weights; STUNner has none
        ),
        ("GatewayConfig", ("spec", "authRef"), gateway_api.SecretObjectReference, set(), set()),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_crd_fields_are_the_fields_the_operator_reads(
    kind: str,
    path: tuple[str, ...],
    model: type[Any],
    unused_by_operator: set[str],
    not_in_crd: set[str],
) -> None:
    schema = crd_version_schema(_crd(kind), "v1")
    for step in path:
        schema = schema["items"] if step == "[]" else schema["properties"][step]
    crd_fields = set(schema["properties"])
    model_fields = _aliases(model)
    assert crd_fields - unused_by_operator == model_fields - not_in_crd
