"""The conformance comparison itself (no cluster): canonical configs, flattened paths, and the
documented differences, each explained in docs/upstream-differences.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conformance.compare import canonical_config, diff, flatten, match
from conformance.documented import DOCUMENTED, Documented
from conformance.run import verdict
from conformance.sides import allocated_addresses_named

DOC = Path(__file__).resolve().parents[2] / "docs" / "upstream-differences.md"


def test_listener_and_cluster_order_is_not_a_difference() -> None:
    a = {"listeners": [{"name": "b", "routes": ["y", "x"]}, {"name": "a"}], "clusters": []}
    b = {"listeners": [{"name": "a"}, {"name": "b", "routes": ["x", "y"]}], "clusters": []}
    assert canonical_config(a) == canonical_config(b)
    assert diff({"configs": {"ns/gw": a}}, {"configs": {"ns/gw": b}}) == []


def test_a_changed_leaf_is_one_undocumented_difference_named_by_its_path() -> None:
    up = {"configs": {"ns/gw": {"auth": {"realm": "a"}, "listeners": [{"name": "l", "port": 1}]}}}
    ours = {"configs": {"ns/gw": {"auth": {"realm": "a"}, "listeners": [{"name": "l", "port": 2}]}}}
    (only,) = diff(up, ours)
    assert only.path == "configs.ns/gw.listeners[name=l].port"
    assert (only.upstream, only.ours) == (1, 2)
    assert only.documented is None
    assert verdict([only]) == "differs"


def test_flatten_keys_named_items_by_name_and_keeps_scalar_lists_whole() -> None:
    flat = flatten({"a": [{"name": "x", "v": 1}], "b": [3, 1], "c": {}})
    assert flat == {"a[name=x].name": "x", "a[name=x].v": 1, "b": [3, 1], "c": {}}


@pytest.mark.parametrize("entry", DOCUMENTED, ids=[e.id for e in DOCUMENTED])
def test_every_documented_difference_is_explained_in_the_document(entry: object) -> None:
    text = DOC.read_text()
    assert re.search(rf"\*\*`{re.escape(entry.id)}`\*\*", text), entry.id  # type: ignore[attr-defined]


# One difference each entry was written for, as `make conformance` showed it.
EXAMPLES = {
    "missing-staticservice-empty-cluster": (
        "configs.stunner/udp-gateway.clusters[name=stunner/media-plane-route].type",
        "<absent>",
        "STATIC",
    ),
    "dataplane-env-cds-token": (
        "deployments.stunner/udp-gateway.containers[name=stunner-daemon].env",
        ["STUNNER_ADDR", "STUNNER_NAME"],
        ["CDS_TOKEN", "STUNNER_ADDR", "STUNNER_NAME"],
    ),
    "dataplane-defaults": (
        "deployments.stunner/gateway-sample.terminationGracePeriodSeconds",
        3600,
        30,
    ),
    "dataplane-default-args": (
        "deployments.stunner/udp-gateway.containers[name=stunner-daemon].args",
        ["-w", "--udp-thread-num=16"],
        ["-w"],
    ),
    "dataplane-default-pull-policy": (
        "deployments.stunner/udp-gateway.containers[name=stunner-daemon].imagePullPolicy",
        "Always",
        "IfNotPresent",
    ),
    "hostnetwork-listener-ports": (
        "deployments.stunner/udp-gateway.containers[name=stunner-daemon].ports",
        ["metrics-port:8080/TCP"],
        [":3478/UDP", "metrics-port:8080/TCP"],
    ),
    "listener-programmed": (
        "statuses.Gateway stunner/udp-gateway.listeners.udp-listener.conditions.Programmed",
        "<absent>",
        ["True", "Programmed"],
    ),
    "route-resolvedrefs-no-endpoints": (
        "statuses.stunner.l7mp.io/v1 UDPRoute stunner/r.parents./udp-gateway:.ResolvedRefs",
        ["False", "BackendNotFound"],
        ["True", "ResolvedRefs"],
    ),
    "route-accepted-unserved-parent": (
        "statuses.stunner.l7mp.io/v1 UDPRoute stunner/missing-only.parents./tls-gateway:"
        "tls-missing.Accepted",
        ["True", "Accepted"],
        ["False", "Pending"],
    ),
    "route-unserved-no-cluster": (
        "configs.stunner/tls-gateway.clusters[name=stunner/missing-only].endpoints",
        ["<clusterIP stunner/media>"],
        "<absent>",
    ),
    "route-missing-first-backend": (
        "configs.stunner/udp-gateway.clusters[name=stunner/svc-missing-then-static].endpoints",
        "<absent>",
        ["10.11.12.13"],
    ),
    "premium-user-quota": ("configs.stunner/udp-gateway.admin.user_quota", "<absent>", 5),
    "premium-auth-lifetime": (
        "configs.stunner/udp-gateway.auth.credentials.lifetime",
        "<absent>",
        "600",
    ),
    "premium-relay-address-discovery": (
        "configs.stunner/udp-gateway.listeners[name=stunner/udp-gateway/udp-listener].address",
        "$STUNNER_ADDR",
        "__node_address_placeholder",
    ),
    "premium-stun-mode": ("configs.stunner/udp-gateway.auth.type", "static", "none"),
    "premium-daemonset": ("deployments.stunner/udp-gateway.kind", "Deployment", "DaemonSet"),
    "targetport-conflict": (
        "configs.stunner/targetport-clash.listeners[name=stunner/targetport-clash/udp-b].port",
        3478,
        "<absent>",
    ),
    "listener-port-conflict-reason": (
        "statuses.Gateway stunner/same-port.listeners.udp-b.conditions.Conflicted",
        ["True", "ProtocolConflict"],
        ["True", "PortConflict"],
    ),
    "gateway-listeners-not-valid": (
        "statuses.Gateway stunner/same-port.conditions.Accepted",
        ["True", "Accepted"],
        ["True", "ListenersNotValid"],
    ),
    "same-port-listeners-service": (
        "services.stunner/same-port.ports[name=udp-a].port",
        "<absent>",
        3478,
    ),
}


@pytest.mark.parametrize("entry", DOCUMENTED, ids=[e.id for e in DOCUMENTED])
def test_every_documented_difference_accepts_its_example_and_not_the_reverse(
    entry: Documented,
) -> None:
    path, upstream, ours = EXAMPLES[entry.id]
    assert match(path, upstream, ours) is entry
    # The reverse is not this entry's difference (another entry may name it: a cluster we drop
    # for an unserved route is the reverse of the empty cluster we keep for a missing one).
    assert not entry.accepts(ours, upstream)


def test_a_case_where_upstream_has_no_service_at_all_is_the_refused_service() -> None:
    """Upstream's only Service refused: its ``services`` is empty, ours has leaves instead."""
    entry = match("services", {}, "<absent>")
    assert entry is not None
    assert entry.id == "same-port-listeners-service"
    assert match("services", "<absent>", {}) is None


def test_an_unrelated_change_on_a_documented_path_is_not_accepted() -> None:
    path = "deployments.stunner/udp-gateway.containers[name=stunner-daemon].env"
    assert match(path, ["STUNNER_ADDR"], ["STUNNER_ADDR", "SOMETHING_ELSE"]) is None


def test_allocated_cluster_ips_are_named_by_their_service_and_nothing_else_changes() -> None:
    """Each API server allocates its own ClusterIPs; the comparison sees the Service instead."""
    names = {"10.96.0.7": "<clusterIP media/echo>"}
    ours = {"clusters": [{"endpoints": ["10.96.0.7", "10.244.0.5", "10.96.0.7/32"]}]}
    theirs = {"clusters": [{"endpoints": ["10.0.0.9", "10.244.0.5"]}]}
    assert allocated_addresses_named(ours, names) == {
        "clusters": [
            {"endpoints": ["<clusterIP media/echo>", "10.244.0.5", "<clusterIP media/echo>"]}
        ]
    }
    named_theirs = allocated_addresses_named(theirs, {"10.0.0.9": "<clusterIP media/echo>"})
    assert named_theirs["clusters"][0]["endpoints"][0] == "<clusterIP media/echo>"
    assert allocated_addresses_named({"a": "10.96.0.70"}, names) == {"a": "10.96.0.70"}
