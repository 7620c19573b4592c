"""Dual-stack Gateways: IPv6 public addresses, the Service's IP families, a dual-stack dataplane,
and routes to dual-stack Services and IPv6 StaticServices (golden output, plus the rules)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from stunner_common.crds import Gateway
from stunner_operator.render.annotations import annotation_problems
from stunner_operator.render.engine import Renderer
from stunner_operator.render.families import IpFamilies, ip_families
from support.operator import FIXTURES, objects_from_yaml, snapshot

CASE = FIXTURES / "dual-stack" / "gateways.yaml"
GOLDEN = FIXTURES / "dual-stack" / "golden.json"
BASE = FIXTURES / "seeds" / "base.yaml"


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    renderer = Renderer()
    renderer.apply([*objects_from_yaml(BASE.read_text()), *objects_from_yaml(CASE.read_text())])
    return snapshot(renderer)


def test_dual_stack_gateways_render_to_the_golden_output(rendered: dict[str, Any]) -> None:
    if os.environ.get("UPDATE_GOLDENS"):
        GOLDEN.write_text(json.dumps(rendered, indent=2, sort_keys=True) + "\n")
    assert rendered == json.loads(GOLDEN.read_text())


def test_a_gateway_with_public_ips_of_both_families_gets_a_dual_stack_service_and_dataplane(
    rendered: dict[str, Any],
) -> None:
    spec = rendered["services"]["stunner/dual-gateway"]["spec"]
    assert spec["ipFamilyPolicy"] == "RequireDualStack"
    assert spec["ipFamilies"] == ["IPv4", "IPv6"]
    assert spec["externalIPs"] == ["203.0.113.10", "2001:db8::10"]
    (listener,) = rendered["configs"]["stunner/dual-gateway"]["listeners"]
    assert listener["public_address"] == "203.0.113.10"
    assert rendered["statuses"]["Gateway stunner/dual-gateway"]["addresses"] == [
        {"type": "IPAddress", "value": "203.0.113.10"},
        {"type": "IPAddress", "value": "2001:db8::10"},
    ]
    env = rendered["deployments"]["stunner/dual-gateway"]["spec"]["template"]["spec"]["containers"][
        0
    ]["env"]
    assert {"name": "STUNNERD_BIND_HOST", "value": "::"} in env
    assert {
        "name": "STUNNERD_RELAY_ADDRESSES",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}},
    } in env


def test_an_ipv6_public_ip_is_the_listeners_public_address(rendered: dict[str, Any]) -> None:
    (listener,) = rendered["configs"]["stunner/v6-gateway"]["listeners"]
    assert listener["public_address"] == "2001:db8::20"
    spec = rendered["services"]["stunner/v6-gateway"]["spec"]
    assert spec["loadBalancerIP"] == "2001:db8::20"
    assert "ipFamilyPolicy" not in spec  # one family: the cluster's defaults
    env = rendered["deployments"]["stunner/v6-gateway"]["spec"]["template"]["spec"]["containers"][
        0
    ]["env"]
    assert all(e["name"] != "STUNNERD_RELAY_ADDRESSES" for e in env)


def test_the_ip_family_annotations_shape_the_service(rendered: dict[str, Any]) -> None:
    spec = rendered["services"]["stunner/annotated-gateway"]["spec"]
    assert spec["ipFamilyPolicy"] == "PreferDualStack"
    assert spec["ipFamilies"] == ["IPv6", "IPv4"]


def test_routes_admit_both_cluster_ips_every_endpoint_slice_and_ipv6_prefixes(
    rendered: dict[str, Any],
) -> None:
    (cluster,) = rendered["configs"]["stunner/dual-gateway"]["clusters"]
    assert cluster["endpoints"] == sorted(
        [
            "10.96.0.20",
            "fd00:96::20",
            "10.244.0.21",
            "fd00:244::21",
            "fd00:10::/64",
            "2001:db8:100::7",
        ]
    )


def gateway(addresses: list[str], annotations: dict[str, str] | None = None) -> Gateway:
    return Gateway.model_validate(
        {
            "metadata": {"name": "g", "namespace": "n", "annotations": annotations or {}},
            "spec": {
                "gatewayClassName": "c",
                "addresses": [{"value": a} for a in addresses],
                "listeners": [{"name": "l", "port": 3478, "protocol": "TURN-UDP"}],
            },
        }
    )


@pytest.mark.parametrize(
    ("addresses", "annotations", "expected"),
    [
        ([], {}, IpFamilies()),
        (["203.0.113.1"], {}, IpFamilies()),
        (["2001:db8::1", "203.0.113.1"], {}, IpFamilies("RequireDualStack", ("IPv6", "IPv4"))),
        (["203.0.113.1", "203.0.113.2"], {}, IpFamilies()),
        (
            [],
            {"stunner.l7mp.io/ip-family-policy": "preferdualstack"},
            IpFamilies("PreferDualStack"),
        ),
        ([], {"stunner.l7mp.io/ip-families": "IPv6"}, IpFamilies(None, ("IPv6",))),
        (
            [],
            {"stunner.l7mp.io/ip-families": "IPv4, IPv6"},
            IpFamilies("RequireDualStack", ("IPv4", "IPv6")),
        ),
        (
            [],
            {
                "stunner.l7mp.io/ip-family-policy": "SingleStack",
                "stunner.l7mp.io/ip-families": "IPv6,IPv4",
            },
            IpFamilies("SingleStack", ("IPv6",)),
        ),
        # the annotation wins over the addresses
        (
            ["2001:db8::1", "203.0.113.1"],
            {"stunner.l7mp.io/ip-family-policy": "SingleStack"},
            IpFamilies("SingleStack"),
        ),
        # bad values are ignored (and reported, below)
        ([], {"stunner.l7mp.io/ip-family-policy": "Both"}, IpFamilies()),
        ([], {"stunner.l7mp.io/ip-families": "IPv4,IPv4"}, IpFamilies()),
    ],
)
def test_ip_families_come_from_the_annotations_or_the_addresses(
    addresses: list[str], annotations: dict[str, str], expected: IpFamilies
) -> None:
    assert ip_families(gateway(addresses, annotations), annotations) == expected


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"stunner.l7mp.io/ip-family-policy": "Both"},
            "is not one of SingleStack, PreferDualStack",
        ),
        ({"stunner.l7mp.io/ip-families": "IPv5"}, "is not IPv4, IPv6 or both"),
        (
            {
                "stunner.l7mp.io/ip-family-policy": "SingleStack",
                "stunner.l7mp.io/ip-families": "IPv4,IPv6",
            },
            "SingleStack takes one family; using IPv4",
        ),
    ],
)
def test_bad_ip_family_annotations_are_reported(annotations: dict[str, str], message: str) -> None:
    problems = annotation_problems(annotations, ["l"])
    assert any(message in p for p in problems), problems
