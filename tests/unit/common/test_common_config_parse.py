"""The parsing pipeline: YAML/JSON, key case, v1alpha1, env substitution."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from stunner_common.config import (
    ConfigParseError,
    ConfigValidationError,
    expand_env_vars,
    load_config_file,
    parse_config,
    self_signed_pair,
)


@pytest.fixture(scope="module")
def tls_b64() -> tuple[str, str]:
    return self_signed_pair("127.0.0.1")


# An operator-rendered config, with real TLS material substituted in the test.
EXAMPLE_1_9 = """
{
  "version": "v1",
  "admin": {
    "name": "stunner/udp-gateway",
    "loglevel": "all:INFO,turn:DEBUG",
    "metrics_endpoint": "http://:8080/metrics",
    "healthcheck_endpoint": "http://:8086",
    "user_quota": 0,
    "offload_engine": "None",
    "offload_interfaces": []
  },
  "auth": {
    "type": "ephemeral",
    "realm": "stunner.l7mp.io",
    "credentials": { "secret": "my-shared-secret" }
  },
  "listeners": [
    {
      "name": "stunner/udp-gateway/udp-listener",
      "protocol": "TURN-UDP",
      "address": "$STUNNER_ADDR",
      "port": 3478,
      "public_address": "203.0.113.10",
      "public_port": 3478,
      "routes": ["stunner/media-plane", "stunner/iperf-server"]
    },
    {
      "name": "stunner/udp-gateway/tls-listener",
      "protocol": "TURN-TLS",
      "address": "$STUNNER_ADDR",
      "port": 443,
      "cert": "CERT",
      "key": "KEY",
      "routes": ["stunner/media-plane"]
    }
  ],
  "clusters": [
    {
      "name": "stunner/media-plane",
      "type": "STATIC",
      "protocol": "UDP",
      "endpoints": ["10.244.1.17", "10.244.2.0/24:<10000-20000>", "10.96.12.34"]
    },
    {
      "name": "stunner/iperf-server",
      "type": "STRICT_DNS",
      "protocol": "udp",
      "endpoints": ["iperf-server.default.svc.cluster.local"]
    }
  ]
}
"""

YAML_V1 = """
version: v1
admin:
  logLevel: all:DEBUG
  healthCheck_Endpoint: ""
auth:
  Type: static
  credentials:
    username: user1
    password: pass1
listeners:
  - name: udp
    protocol: udp
    port: 3478
    routes: [echo]
clusters:
  - name: echo
    endpoints:
      - 127.0.0.1
"""

V1ALPHA1_PLAINTEXT = """
version: v1alpha1
admin:
  name: legacy
auth:
  type: plaintext
  realm: my-realm
  credentials:
    username: user1
    password: pass1
listeners:
  - name: udp
    protocol: TURN-UDP
    port: 3478
    min_relay_port: 10000
    max_relay_port: 20000
    routes: [echo]
clusters:
  - name: echo
    type: STATIC
    endpoints: ["0.0.0.0/0"]
"""

V1ALPHA1_LONGTERM = """
{"version": "v1alpha1", "auth": {"type": "longterm", "credentials": {"secret": "s3cret"}}}
"""


def test_operator_example_parses_to_the_documented_canonical_form(
    tls_b64: tuple[str, str],
) -> None:
    cert, key = tls_b64
    text = EXAMPLE_1_9.replace('"CERT"', f'"{cert}"').replace('"KEY"', f'"{key}"')
    cfg = parse_config(text, env={"STUNNER_ADDR": "10.244.0.5"})
    udp = cfg.listener("stunner/udp-gateway/udp-listener")
    assert udp is not None
    assert udp.routes == ("stunner/iperf-server", "stunner/media-plane")
    assert udp.address == "10.244.0.5"
    assert cfg.cluster("stunner/iperf-server") is not None
    assert cfg.clusters[0].protocol == "UDP"
    media = cfg.cluster("stunner/media-plane")
    assert media is not None
    assert media.endpoints == ("10.244.1.17", "10.244.2.0/24:<10000-20000>", "10.96.12.34")
    assert [item.name for item in cfg.listeners] == sorted(item.name for item in cfg.listeners)
    assert cfg.auth.credentials == {"secret": "my-shared-secret"}
    assert cfg.admin.metrics_endpoint == "http://:8080/metrics"


def test_operator_example_keeps_placeholders_when_expansion_is_off(
    tls_b64: tuple[str, str],
) -> None:
    cert, key = tls_b64
    text = EXAMPLE_1_9.replace('"CERT"', f'"{cert}"').replace('"KEY"', f'"{key}"')
    cfg = parse_config(text, expand_env=False)
    assert {item.address for item in cfg.listeners} == {"$STUNNER_ADDR"}


def test_yaml_keys_match_case_insensitively_and_unknown_keys_are_ignored() -> None:
    cfg = parse_config(YAML_V1, env={})
    assert cfg.admin.loglevel == "all:DEBUG"
    assert cfg.admin.healthcheck_endpoint == ""
    assert cfg.listeners[0].protocol == "TURN-UDP"
    assert cfg.clusters[0].endpoints == ("127.0.0.1",)


def test_yaml_and_json_of_the_same_config_are_equal() -> None:
    json_text = parse_config(YAML_V1, env={}).canonical_json()
    assert parse_config(json_text, env={}) == parse_config(YAML_V1, env={})
    assert parse_config(YAML_V1.encode(), env={}) == parse_config(YAML_V1, env={})


def test_json_that_yaml_cannot_read_falls_back_to_json() -> None:
    text = '{"version":"v1","auth":{"credentials":{"username":"a\\/b","password":"\\t"}}}'
    assert parse_config(text).auth.credentials == {"username": "a/b", "password": "\t"}


def test_exact_key_match_and_last_key_wins_like_gos_decoder() -> None:
    cfg = parse_config(
        {
            "version": "v1",
            "auth": {"credentials": {"username": "u", "password": "p"}},
            "admin": {"loglevel": "all:ERROR", "LogLevel": "all:WARN"},
        }
    )
    assert cfg.admin.loglevel == "all:WARN"


def test_null_values_mean_defaults() -> None:
    cfg = parse_config(
        "version: v1\nadmin: null\nauth: {type: none, credentials: null}\n"
        "listeners: null\nclusters: [{name: c, endpoints: null, type: null}]\n"
    )
    assert cfg.admin.name == "default-stunnerd"
    assert cfg.listeners == ()
    assert cfg.clusters[0].type == "STATIC"


def test_v1alpha1_plaintext_is_converted_to_v1_static() -> None:
    cfg = parse_config(V1ALPHA1_PLAINTEXT, env={})
    assert cfg.version == "v1"
    assert cfg.auth.type == "static"
    assert cfg.auth.realm == "my-realm"
    assert cfg.admin.name == "legacy"
    assert cfg.listeners[0].routes == ("echo",)
    assert cfg.clusters[0].endpoints == ("0.0.0.0/0",)


def test_v1alpha1_longterm_is_converted_to_v1_ephemeral() -> None:
    cfg = parse_config(V1ALPHA1_LONGTERM, env={})
    assert (cfg.version, cfg.auth.type) == ("v1", "ephemeral")
    assert cfg.auth.credentials == {"secret": "s3cret"}


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("$A", {"A": "1"}, "1"),
        ("${A}", {"A": "1"}, "1"),
        ("x${A}y", {"A": "1"}, "x1y"),
        ("$A$B", {"A": "1", "B": "2"}, "12"),
        ("$UNSET", {}, ""),
        ("a$", {}, "a$"),
        ("a$ b", {}, "a$ b"),
        ("a$.b", {}, "a$.b"),
        ("${}", {}, ""),
        ("x${A", {"A": "1"}, "xA"),
        ("$1", {"1": "one"}, "one"),
        ("$$", {}, ""),
        ("${A_B}c", {"A_B": "v"}, "vc"),
        ("$A_B.c", {"A_B": "v"}, "v.c"),
        ("no dollar", {}, "no dollar"),
    ],
)
def test_env_expansion_follows_gos_os_expand(text: str, env: dict[str, str], expected: str) -> None:
    assert expand_env_vars(text, env) == expected


def test_env_is_substituted_in_every_string_but_credentials() -> None:
    text = """
version: v1
admin: {name: "$NS/$NAME"}
auth:
  realm: $REALM
  credentials: {username: "$USER", password: "pa$$word$", secret: "${SECRET}"}
listeners:
  - {name: l, address: $STUNNER_ADDR, port: $STUNNER_PORT, public_address: "${PUBLIC}"}
"""
    env = {
        "NS": "ns",
        "NAME": "gw",
        "REALM": "r",
        "USER": "x",
        "SECRET": "y",
        "STUNNER_ADDR": "10.0.0.1",
        "PUBLIC": "1.2.3.4",
    }
    cfg = parse_config(text, env=env)
    assert cfg.admin.name == "ns/gw"
    assert cfg.auth.realm == "r"
    assert cfg.auth.credentials == {
        "username": "$USER",
        "password": "pa$$word$",
        "secret": "${SECRET}",
    }
    lis = cfg.listeners[0]
    assert (lis.address, lis.port, lis.public_address) == ("10.0.0.1", 3478, "1.2.3.4")


@pytest.mark.parametrize(
    "credentials",
    [
        {"username": "$user", "password": "$pass"},
        {"username": "us$er", "password": "pa$s"},
        {"username": "user$", "password": "pass$"},
        {"username": "${HOME}", "password": "$$$"},
    ],
)
@pytest.mark.parametrize("auth_key", ["auth", "Auth", "AUTH"])
def test_dollar_signs_in_static_credentials_survive_substitution(
    credentials: dict[str, str], auth_key: str
) -> None:
    data = {"version": "v1", auth_key: {"Credentials": credentials}}
    cfg = parse_config(data, env={"HOME": "/root", "user": "X", "pass": "Y"})
    assert cfg.auth.credentials == credentials


@pytest.mark.parametrize("secret", ["$secret", "sec$ret", "secret$", "${S}"])
def test_dollar_signs_in_ephemeral_secrets_survive_substitution(secret: str) -> None:
    text = f'{{"version":"v1","auth":{{"type":"ephemeral","credentials":{{"secret":"{secret}"}}}}}}'
    cfg = parse_config(text, env={"secret": "X", "S": "Y"})
    assert cfg.auth.credentials == {"secret": secret}


@pytest.mark.parametrize(
    ("env", "port"),
    [
        ({}, 3478),
        ({"STUNNER_PORT": ""}, 3478),
        ({"STUNNER_PORT": "abc"}, 3478),
        ({"STUNNER_PORT": "abc", "STUNNER_PUBLIC_PORT": "443"}, 443),
        ({"STUNNER_PUBLIC_PORT": "bad"}, 3478),
        ({"STUNNER_PORT": "5000", "STUNNER_PUBLIC_PORT": "443"}, 5000),
    ],
)
def test_stunner_port_falls_back_to_public_port_then_3478(env: dict[str, str], port: int) -> None:
    text = "version: v1\nauth: {type: none}\nlisteners: [{name: l, port: $STUNNER_PORT}]"
    assert parse_config(text, env=env).listeners[0].port == port


def test_parsing_never_changes_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STUNNER_PORT", raising=False)
    monkeypatch.setenv("STUNNER_TEST_ADDR", "10.1.1.1")
    before = dict(os.environ)
    text = "version: v1\nauth: {type: none}\nlisteners: [{name: l, address: $STUNNER_TEST_ADDR}]"
    cfg = parse_config(text)
    assert cfg.listeners[0].address == "10.1.1.1"
    assert dict(os.environ) == before


def test_the_env_argument_is_not_modified() -> None:
    env = {"A": "1"}
    parse_config("version: v1\nauth: {type: none}\nadmin: {name: $A}", env=env)
    assert env == {"A": "1"}


def test_a_placeholder_in_an_integer_field_that_expands_to_junk_fails() -> None:
    text = "version: v1\nauth: {type: none}\nlisteners: [{name: l, port: $BAD}]"
    with pytest.raises(ConfigValidationError, match="expected an integer") as info:
        parse_config(text, env={"BAD": "eighty"})
    assert info.value.field == "listeners[0].port"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("", "empty config"),
        ("   \n", "empty config"),
        (b"\xff\xfe\x00", "not UTF-8"),
        ("version: [v1", "neither YAML nor JSON"),
        ('{"version": "v1",', "neither YAML nor JSON"),
        ("- a\n- b\n", "must be a mapping"),
        ("just a string", "must be a mapping"),
        ("42", "must be a mapping"),
        ("---\na: 1\n---\nb: 2\n", "neither YAML nor JSON"),
    ],
)
def test_unreadable_input_raises_a_parse_error(data: str | bytes, message: str) -> None:
    with pytest.raises(ConfigParseError, match=message):
        parse_config(data)


@pytest.mark.parametrize("data", [None, 42, ["version", "v1"], object()])
def test_input_that_is_not_text_or_a_mapping_raises_a_parse_error(data: Any) -> None:
    with pytest.raises(ConfigParseError, match="cannot read a config from a"):
        parse_config(data)


def test_yaml_alias_bombs_are_refused_not_expanded() -> None:
    lines = ["version: v1", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        prev = f"*a{level - 1}"
        lines.append(f"a{level}: &a{level} [{', '.join([prev] * 10)}]")
    with pytest.raises(ConfigParseError, match="too large"):
        parse_config("\n".join(lines))


def test_deeply_nested_input_is_refused() -> None:
    with pytest.raises(ConfigParseError):
        parse_config('{"version":"v1","x":' + "[" * 5000 + "]" * 5000 + "}")


def test_a_config_file_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "stunnerd.conf"
    path.write_text(YAML_V1)
    assert load_config_file(path, env={}) == parse_config(YAML_V1, env={})


def test_a_missing_config_file_raises_a_parse_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigParseError, match="cannot read config file"):
        load_config_file(tmp_path / "missing.yaml")


def test_an_empty_config_file_raises_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_bytes(b"")
    with pytest.raises(ConfigParseError, match="empty config"):
        load_config_file(path)


def test_round_trip_through_canonical_json_is_identity(tls_b64: tuple[str, str]) -> None:
    cert, key = tls_b64
    text = EXAMPLE_1_9.replace('"CERT"', f'"{cert}"').replace('"KEY"', f'"{key}"')
    for source in (YAML_V1, V1ALPHA1_PLAINTEXT, V1ALPHA1_LONGTERM, text):
        cfg = parse_config(source, env={"STUNNER_ADDR": "10.0.0.1"})
        again = parse_config(cfg.canonical_json(), env={})
        assert again == cfg
        assert again.canonical_json() == cfg.canonical_json()


def test_mapping_input_is_not_mutated() -> None:
    data: dict[str, Any] = {
        "version": "v1alpha1",
        "auth": {"type": "plaintext", "credentials": {"username": "u", "password": "p"}},
        "listeners": [{"name": "l", "address": "$X", "routes": ["b", "a"]}],
    }
    snapshot = repr(data)
    parse_config(data, env={"X": "1.1.1.1"})
    assert repr(data) == snapshot


@pytest.mark.parametrize(
    ("data", "ok"),
    [
        ({"Version": "v1"}, True),
        ({"VERSION": "v1alpha1"}, True),
        ({"version": "v2", "Version": "v1"}, True),
        ({"version": "v1", "Version": "v2"}, False),
        ({"version": None}, False),
        ({"version": 1}, False),
        ({"version": {("a", "b"): 1}}, False),
        ({"version": ["v1"]}, False),
    ],
)
def test_the_version_key_is_read_like_any_other_key(data: dict[str, Any], ok: bool) -> None:
    full = {**data, "auth": {"type": "none"}}
    if ok:
        assert parse_config(full).version == "v1"
    else:
        with pytest.raises(ConfigValidationError, match="unsupported API version"):
            parse_config(full)
