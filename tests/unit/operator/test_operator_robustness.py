"""Bad input never breaks the renderer: whatever parses as an object renders without raising,
and an invalid Gateway never stops the others from rendering."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stunner_common.crds import CrdError, parse_object
from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, UDP_GATEWAY, objects_from_yaml

texts = st.one_of(
    st.sampled_from(
        [
            "",
            "udp",
            "UDP",
            "TURN-TLS",
            "tls",
            "None",
            "*",
            "0.0.0.0/0",
            "::1",
            "a/b",
            "10.0.0.1:<1-2>",
        ]
    ),
    st.text(max_size=12),
)
ports = st.one_of(st.integers(min_value=-5, max_value=70000), st.sampled_from([1, 3478, 65535]))
small_maps = st.dictionaries(
    st.sampled_from(
        [
            "stunner.l7mp.io/service-type",
            "stunner.l7mp.io/enable-mixed-protocol-lb",
            "stunner.l7mp.io/nodeport",
            "stunner.l7mp.io/targetport",
            "stunner.l7mp.io/external-traffic-policy",
            "stunner.l7mp.io/disable-managed-dataplane",
            "service.beta.kubernetes.io/x-healthcheck-port",
            "service.beta.kubernetes.io/x-healthcheck-protocol",
        ]
    ),
    texts,
    max_size=4,
)


@st.composite
def gateways(draw: st.DrawFn) -> dict[str, Any]:
    listeners = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["a", "b", "c"]),
                    "port": ports,
                    "protocol": texts,
                },
                optional={
                    "tls": st.fixed_dictionaries(
                        {},
                        optional={
                            "mode": st.sampled_from(["Terminate", "Passthrough", "x"]),
                            "certificateRefs": st.lists(
                                st.fixed_dictionaries({"name": texts}), max_size=2
                            ),
                        },
                    ),
                    "allowedRoutes": st.fixed_dictionaries(
                        {
                            "namespaces": st.fixed_dictionaries(
                                {"from": st.sampled_from(["All", "Same", "Selector"])}
                            )
                        }
                    ),
                },
            ),
            max_size=3,
        )
    )
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {
            "name": draw(st.sampled_from(["gw", "gw2"])),
            "namespace": "stunner",
            "annotations": draw(small_maps),
        },
        "spec": {
            "gatewayClassName": draw(st.sampled_from(["stunner", "other"])),
            "listeners": listeners,
            "addresses": draw(st.lists(st.fixed_dictionaries({"value": texts}), max_size=1)),
        },
    }


@st.composite
def routes(draw: st.DrawFn) -> dict[str, Any]:
    backend = st.fixed_dictionaries(
        {"name": texts},
        optional={
            "group": st.sampled_from(["", "stunner.l7mp.io", "x"]),
            "kind": st.sampled_from(["Service", "StaticService", "Pod"]),
            "namespace": texts,
            "port": ports,
            "endPort": ports,
        },
    )
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "UDPRoute",
        "metadata": {"name": draw(st.sampled_from(["r1", "r2"])), "namespace": "stunner"},
        "spec": {
            "parentRefs": draw(
                st.lists(
                    st.fixed_dictionaries(
                        {"name": st.sampled_from(["gw", "gw2", "x"])},
                        optional={"sectionName": st.sampled_from(["a", "b", "z"])},
                    ),
                    max_size=2,
                )
            ),
            "rules": [{"backendRefs": draw(st.lists(backend, max_size=3))}],
        },
    }


@st.composite
def static_services(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "StaticService",
        "metadata": {"name": draw(texts) or "s", "namespace": "stunner"},
        "spec": {"prefixes": draw(st.lists(texts, max_size=3))},
    }


@st.composite
def gateway_configs(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "gwconfig", "namespace": "stunner"},
        "spec": draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "realm": texts,
                    "authType": texts,
                    "userName": texts,
                    "password": texts,
                    "sharedSecret": texts,
                    "logLevel": texts,
                    "dataplane": st.sampled_from(["default", "x"]),
                    "authRef": st.fixed_dictionaries({"name": texts}),
                },
            )
        ),
    }


documents = st.lists(
    st.one_of(gateways(), routes(), static_services(), gateway_configs()), min_size=1, max_size=6
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_anything_that_parses_renders_without_raising(docs: list[dict[str, Any]]) -> None:
    renderer = Renderer()
    renderer.apply(objects_from_yaml(HIERARCHY))
    for doc in docs:
        try:
            obj = parse_object(doc)
        except CrdError:
            continue
        renderer.apply([obj])
    for config in renderer.configs().values():
        config.canonical_json()


@settings(max_examples=100, deadline=None)
@given(gateways())
def test_a_bad_gateway_does_not_disturb_another_gateway(doc: dict[str, Any]) -> None:
    doc["metadata"]["name"] = "bad"
    renderer = Renderer()
    renderer.apply(objects_from_yaml(HIERARCHY + "---\n" + UDP_GATEWAY))
    before = renderer.configs()["stunner/gw"].canonical_json()
    try:
        renderer.apply([parse_object(doc)])
    except CrdError:
        return
    assert renderer.configs()["stunner/gw"].canonical_json() == before
