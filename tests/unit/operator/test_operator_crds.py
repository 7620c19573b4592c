"""The object models: kinds and versions recognised, defaults, tolerance, clear errors."""

from __future__ import annotations

from typing import Any

import pytest

from stunner_common.crds import (
    CrdError,
    Gateway,
    GatewayClass,
    GatewayConfig,
    Secret,
    UDPRoute,
    UDPRouteV1A2,
    UnsupportedKindError,
    kind_of,
    parse_object,
)


def gateway_doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": "ns"},
        "spec": {"gatewayClassName": "c", "listeners": [], **spec},
    }


@pytest.mark.parametrize(
    ("api_version", "kind", "model"),
    [
        ("gateway.networking.k8s.io/v1", "GatewayClass", GatewayClass),
        ("gateway.networking.k8s.io/v1beta1", "GatewayClass", GatewayClass),
        ("gateway.networking.k8s.io/v1alpha2", "UDPRoute", UDPRouteV1A2),
        ("stunner.l7mp.io/v1", "UDPRoute", UDPRoute),
        ("stunner.l7mp.io/v1", "GatewayConfig", GatewayConfig),
        ("stunner.l7mp.io/v1alpha1", "GatewayConfig", GatewayConfig),
        ("v1", "Secret", Secret),
    ],
)
def test_api_group_and_kind_pick_the_model(api_version: str, kind: str, model: type) -> None:
    obj = parse_object({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}})
    assert type(obj) is model


def test_the_two_udproute_flavours_have_distinct_store_kinds() -> None:
    v1 = parse_object(
        {"apiVersion": "stunner.l7mp.io/v1", "kind": "UDPRoute", "metadata": {"name": "r"}}
    )
    v1a2 = parse_object(
        {
            "apiVersion": "gateway.networking.k8s.io/v1alpha2",
            "kind": "UDPRoute",
            "metadata": {"name": "r"},
        }
    )
    assert (kind_of(v1), kind_of(v1a2)) == ("UDPRoute", "UDPRouteV1A2")


def test_unknown_fields_are_kept_and_do_not_fail() -> None:
    doc = gateway_doc(infrastructure={"labels": {"a": "b"}})
    doc["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    gw = parse_object(doc)
    assert isinstance(gw, Gateway)
    assert gw.spec.model_extra == {"infrastructure": {"labels": {"a": "b"}}}


def test_namespaced_objects_default_to_the_default_namespace_and_cluster_ones_have_none() -> None:
    doc = gateway_doc()
    del doc["metadata"]["namespace"]
    assert parse_object(doc).metadata.namespace == "default"
    cls = parse_object(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "c", "namespace": "oops"},
        }
    )
    assert cls.metadata.namespace == ""


def test_crd_defaults_apply() -> None:
    cfg = parse_object(
        {"apiVersion": "stunner.l7mp.io/v1", "kind": "GatewayConfig", "metadata": {"name": "c"}}
    )
    assert isinstance(cfg, GatewayConfig)
    assert (cfg.spec.realm, cfg.spec.auth_type, cfg.spec.dataplane) == (
        "stunner.l7mp.io",
        "plaintext",
        "default",
    )
    gw = parse_object(gateway_doc(listeners=[{"name": "l", "port": 1, "protocol": "UDP"}]))
    assert isinstance(gw, Gateway)
    assert gw.spec.listeners[0].allowed_routes.namespaces.from_ == "Same"


def test_unquoted_yaml_booleans_and_numbers_in_annotations_become_strings() -> None:
    doc = gateway_doc()
    doc["metadata"]["annotations"] = {"stunner.l7mp.io/enable-mixed-protocol-lb": True, "n": 8086}
    gw = parse_object(doc)
    assert gw.metadata.annotations == {
        "stunner.l7mp.io/enable-mixed-protocol-lb": "true",
        "n": "8086",
    }


def test_secret_merges_data_and_string_data() -> None:
    secret = parse_object(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s"},
            "data": {"a": "YQ==", "b": "Yg=="},
            "stringData": {"b": "override"},
        }
    )
    assert isinstance(secret, Secret)
    assert secret.values() == {"a": b"a", "b": b"override"}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"kind": "Gateway"}, "missing apiVersion or kind"),
        ([1, 2], "expected a mapping"),
        (
            gateway_doc(listeners=[{"name": "l", "port": 70000, "protocol": "UDP"}]),
            "spec.listeners.0.port",
        ),
        ({**gateway_doc(), "spec": {"listeners": []}}, "spec.gatewayClassName: Field required"),
        (
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "%%%"}},
            "data.k is not valid base64",
        ),
        ({"apiVersion": "v1", "kind": "Secret", "metadata": {}}, "Secret without metadata.name"),
        (
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "metadata": {"name": "g"},
                "spec": {
                    "gatewayClassName": "c",
                    "listeners": [
                        {
                            "name": "l",
                            "port": 1,
                            "protocol": "UDP",
                            "allowedRoutes": {"namespaces": {"from": "Everywhere"}},
                        }
                    ],
                },
            },
            "allowedRoutes.namespaces.from",
        ),
    ],
)
def test_invalid_documents_name_the_field(doc: Any, message: str) -> None:
    with pytest.raises(CrdError) as err:
        parse_object(doc)
    assert message in str(err.value)


def test_unsupported_kind_is_its_own_error() -> None:
    with pytest.raises(UnsupportedKindError):
        parse_object({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})
