"""Properties of the config model: canonical form is order-free, round trips, junk never crashes."""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stunner_common.config import (
    ConfigError,
    Endpoint,
    StunnerConfig,
    parse_config,
    parse_endpoint,
)
from stunner_common.turnuri import TurnUri, parse_turn_uri

# STUNNER_FUZZ_EXAMPLES raises the example count for a longer local fuzzing run.
SETTINGS = settings(
    max_examples=int(os.environ.get("STUNNER_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

names = st.text(alphabet="abcdefghij-/0123456789", min_size=1, max_size=12)
ports = st.integers(min_value=0, max_value=65535)


@st.composite
def endpoints(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        ip: str = str(ipaddress.IPv4Address(draw(st.integers(0, 2**32 - 1))))
        max_prefix = 32
    else:
        ip = str(ipaddress.IPv6Address(draw(st.integers(0, 2**128 - 1))))
        max_prefix = 128
    text = ip
    if draw(st.booleans()):
        text += f"/{draw(st.integers(0, max_prefix))}"
    if draw(st.booleans()):
        lo = draw(st.integers(0, 65535))
        hi = draw(st.integers(lo, 65535))
        text += f":<{lo}-{hi}>"
    return text


@st.composite
def listeners(draw: st.DrawFn) -> list[dict[str, Any]]:
    unique = draw(st.lists(names, max_size=4, unique=True))
    return [
        {
            "name": name,
            "protocol": draw(st.sampled_from(["udp", "TURN-UDP", "tcp", "turn-tcp", ""])),
            "address": draw(st.sampled_from(["", "10.0.0.1", "localhost", "$STUNNER_ADDR"])),
            "port": draw(ports),
            "public_port": draw(ports),
            "routes": draw(st.lists(names, max_size=4)),
        }
        for name in unique
    ]


@st.composite
def clusters(draw: st.DrawFn) -> list[dict[str, Any]]:
    unique = draw(st.lists(names, max_size=4, unique=True))
    result = []
    for name in unique:
        if draw(st.booleans()):
            item = {
                "name": name,
                "type": "static",
                "endpoints": draw(st.lists(endpoints(), max_size=5)),
            }
        else:
            dns = st.text(alphabet="abc.", min_size=1, max_size=8)
            item = {
                "name": name,
                "type": "STRICT_DNS",
                "endpoints": draw(st.lists(dns, max_size=3)),
            }
        item["protocol"] = draw(st.sampled_from(["udp", "TCP"]))
        result.append(item)
    return result


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    auth = draw(
        st.sampled_from(
            [
                {"type": "static", "credentials": {"username": "u", "password": "p$"}},
                {"type": "plaintext", "credentials": {"username": "u", "password": "p$"}},
                {"type": "ephemeral", "credentials": {"secret": "s"}},
                {"type": "none"},
            ]
        )
    )
    return {
        "version": draw(st.sampled_from(["v1", "v1alpha1"])),
        "admin": {
            "name": draw(names),
            "user_quota": draw(st.integers(-5, 50)),
            "offload_interfaces": draw(st.lists(names, max_size=3)),
            "offload_engine": draw(st.sampled_from(["", "none", "XDP", "auto"])),
        },
        "auth": auth,
        "listeners": draw(listeners()),
        "clusters": draw(clusters()),
    }


def shuffled(data: dict[str, Any], rnd: Any) -> dict[str, Any]:
    copy = json.loads(json.dumps(data))
    rnd.shuffle(copy["listeners"])
    rnd.shuffle(copy["clusters"])
    rnd.shuffle(copy["admin"]["offload_interfaces"])
    for item in copy["listeners"]:
        rnd.shuffle(item["routes"])
    for item in copy["clusters"]:
        rnd.shuffle(item["endpoints"])
    return copy


@SETTINGS
@given(data=configs(), rnd=st.randoms(use_true_random=False))
def test_canonical_json_does_not_depend_on_list_order(data: dict[str, Any], rnd: Any) -> None:
    env = {"STUNNER_ADDR": "10.1.2.3"}
    first = parse_config(data, env=env)
    second = parse_config(shuffled(data, rnd), env=env)
    assert first == second
    assert first.canonical_json() == second.canonical_json()


@SETTINGS
@given(data=configs())
def test_parse_canonical_json_parse_is_identity(data: dict[str, Any]) -> None:
    cfg = parse_config(data, env={"STUNNER_ADDR": "10.1.2.3"})
    again = parse_config(cfg.canonical_json(), env={})
    assert again == cfg
    assert again.canonical_json() == cfg.canonical_json()
    assert StunnerConfig.model_validate(cfg.to_dict()) == cfg


@SETTINGS
@given(text=endpoints())
def test_endpoint_canonical_form_parses_back_to_the_same_endpoint(text: str) -> None:
    endpoint = parse_endpoint(text)
    assert isinstance(endpoint, Endpoint)
    assert parse_endpoint(str(endpoint)) == endpoint
    assert endpoint.contains(endpoint.network.network_address)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
known_keys = st.sampled_from(
    [
        "version", "admin", "auth", "listeners", "clusters", "name", "loglevel", "type",
        "credentials", "protocol", "port", "routes", "endpoints", "cert", "key", "realm",
        "healthcheck_endpoint", "metrics_endpoint", "user_quota", "offload_engine",
        "offload_interfaces", "license_config", "address", "public_port",
    ]
)  # fmt: skip
junk_trees = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10) | st.just("v1"),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(known_keys | st.text(max_size=5) | st.integers(), children, max_size=5)
    ),
    max_leaves=25,
)


def parses_or_config_error(data: Any) -> None:
    message = ""
    result: StunnerConfig | None = None
    try:
        result = parse_config(data, env={})
    except ConfigError as exc:
        message = str(exc)
    assert message if result is None else isinstance(result, StunnerConfig)


@SETTINGS
@given(text=st.text(max_size=200))
def test_random_text_raises_only_config_errors(text: str) -> None:
    parses_or_config_error(text)


@SETTINGS
@given(blob=st.binary(max_size=200))
def test_random_bytes_raise_only_config_errors(blob: bytes) -> None:
    parses_or_config_error(blob)


@SETTINGS
@given(tree=st.dictionaries(known_keys, junk_trees, max_size=6))
def test_random_structures_raise_only_config_errors(tree: dict[str, Any]) -> None:
    parses_or_config_error(tree)
    parses_or_config_error(json.dumps(tree))


@SETTINGS
@given(data=configs(), path=st.lists(st.integers(0, 10), min_size=1, max_size=4), junk=json_values)
def test_a_valid_config_with_one_value_replaced_by_junk_never_crashes(
    data: dict[str, Any], path: list[int], junk: Any
) -> None:
    node: Any = data
    for step in path[:-1]:
        children = list(node.values()) if isinstance(node, dict) else node
        containers = [child for child in children if isinstance(child, dict | list)]
        if not containers:
            break
        node = containers[step % len(containers)]
    if isinstance(node, dict) and node:
        node[sorted(node)[path[-1] % len(node)]] = junk
    elif isinstance(node, list) and node:
        node[path[-1] % len(node)] = junk
    parses_or_config_error(data)


@SETTINGS
@given(text=st.text(max_size=60))
def test_random_turn_uris_raise_only_config_errors(text: str) -> None:
    try:
        uri = parse_turn_uri(text)
    except ConfigError:
        return
    assert isinstance(uri, TurnUri)
    assert 1 <= uri.port <= 65535


@SETTINGS
@given(text=st.text(alphabet="0123456789abcdef.:/<>-[] ", max_size=40))
def test_random_endpoints_raise_only_config_errors(text: str) -> None:
    try:
        endpoint = parse_endpoint(text)
    except ConfigError:
        return
    assert parse_endpoint(str(endpoint)) == endpoint
