"""The stunnerd config v1 model: defaults, normalisation and validation rules."""

from __future__ import annotations

import base64
import copy
import json
import pickle
from typing import Any

import pytest

from stunner_common.config import (
    AdminConfig,
    AuthConfig,
    ClusterConfig,
    ConfigParseError,
    ConfigValidationError,
    ListenerConfig,
    StunnerConfig,
    parse_config,
    self_signed_pair,
)
from support.fresh import modules_after, roots

STATIC_AUTH = {"credentials": {"username": "user", "password": "pass"}}


def config(**sections: Any) -> StunnerConfig:
    data: dict[str, Any] = {"version": "v1", "auth": STATIC_AUTH}
    data.update(sections)
    return parse_config(data, env={})


def listener(**fields: Any) -> ListenerConfig:
    return config(listeners=[{"name": "l", **fields}]).listeners[0]


def cluster(**fields: Any) -> ClusterConfig:
    return config(clusters=[{"name": "c", **fields}]).clusters[0]


@pytest.fixture(scope="module")
def tls_pair() -> tuple[str, str]:
    return self_signed_pair("127.0.0.1")


def test_minimal_config_gets_every_default_injected() -> None:
    cfg = parse_config('{"version":"v1","auth":{"credentials":{"username":"u","password":"p"}}}')
    assert cfg.admin == AdminConfig(
        name="default-stunnerd",
        loglevel="all:INFO",
        metrics_endpoint="",
        healthcheck_endpoint="http://:8086",
        user_quota=0,
        offload_engine="None",
        offload_interfaces=(),
        license_config=None,
    )
    assert cfg.auth.type == "static"
    assert cfg.auth.realm == "stunner.l7mp.io"
    assert cfg.listeners == ()
    assert cfg.clusters == ()


def test_listener_and_cluster_defaults_are_injected() -> None:
    lis = listener()
    assert (lis.protocol, lis.address, lis.port) == ("TURN-UDP", "0.0.0.0", 3478)
    assert (lis.public_address, lis.public_port, lis.cert, lis.key) == ("", 0, "", "")
    assert lis.routes == ()
    clu = cluster()
    assert (clu.type, clu.protocol, clu.endpoints) == ("STATIC", "UDP", ())


@pytest.mark.parametrize(
    ("field", "given", "expected"),
    [
        ("name", "", "default-stunnerd"),
        ("name", "ns/gw", "ns/gw"),
        ("loglevel", "", "all:INFO"),
        ("loglevel", "all:DEBUG,turn:TRACE", "all:DEBUG,turn:TRACE"),
        ("loglevel", "not a spec at all", "not a spec at all"),
        ("healthcheck_endpoint", None, "http://:8086"),
        ("healthcheck_endpoint", "", ""),
        ("healthcheck_endpoint", "http://127.0.0.1:8087", "http://127.0.0.1:8087"),
        ("healthcheck_endpoint", "http://", "http://"),
        ("metrics_endpoint", "http://:8080/metrics", "http://:8080/metrics"),
        ("user_quota", -5, 0),
        ("user_quota", 12, 12),
        ("user_quota", "12", 12),
        ("offload_engine", "", "None"),
        ("offload_engine", "xdp", "XDP"),
        ("offload_engine", "tc", "TC"),
        ("offload_engine", "AUTO", "Auto"),
        ("offload_engine", "none", "None"),
        ("offload_interfaces", ["c", "a", "b"], ("a", "b", "c")),
    ],
)
def test_admin_fields_are_defaulted_and_normalised(field: str, given: Any, expected: Any) -> None:
    assert getattr(config(admin={field: given}).admin, field) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("static", "static"),
        ("plaintext", "static"),
        ("ephemeral", "ephemeral"),
        ("longterm", "ephemeral"),
        ("none", "none"),
        ("", "static"),
    ],
)
def test_auth_type_aliases_map_to_the_canonical_name(given: str, expected: str) -> None:
    creds = {"username": "u", "password": "p", "secret": "s"}
    assert config(auth={"type": given, "credentials": creds}).auth.type == expected


@pytest.mark.parametrize("given", ["Static", "PLAINTEXT", "Ephemeral", "None", "dummy"])
def test_auth_type_is_case_sensitive_and_unknown_types_fail(given: str) -> None:
    with pytest.raises(ConfigValidationError, match=f'unknown authentication type: "{given}"'):
        config(auth={"type": given, "credentials": {"username": "u", "password": "p"}})


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"credentials": {"password": "p"}}, "static: empty username or password"),
        ({"credentials": {"username": "u"}}, "static: empty username or password"),
        ({}, "static: empty username or password"),
        ({"type": "ephemeral", "credentials": {}}, "no secret found in ephemeral auth config"),
        ({"type": "longterm"}, "no secret found in ephemeral auth config"),
    ],
)
def test_auth_without_the_credentials_its_type_needs_fails(
    auth: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigValidationError, match=message) as info:
        config(auth=auth)
    assert info.value.field == "auth.credentials"


def test_static_credentials_may_be_empty_strings() -> None:
    cfg = config(auth={"credentials": {"username": "", "password": ""}})
    assert cfg.auth.credentials == {"username": "", "password": ""}


def test_auth_none_needs_no_credentials() -> None:
    cfg = config(auth={"type": "none"})
    assert cfg.auth.type == "none"
    assert cfg.auth.credentials == {}


def test_missing_auth_section_fails_like_empty_static_auth() -> None:
    with pytest.raises(ConfigValidationError, match="static: empty username or password"):
        parse_config({"version": "v1"})


def test_empty_realm_gets_the_default() -> None:
    assert config(auth={**STATIC_AUTH, "realm": ""}).auth.realm == "stunner.l7mp.io"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("turn-udp", "TURN-UDP"),
        ("TURN-TCP", "TURN-TCP"),
        ("Turn-Tcp", "TURN-TCP"),
        ("udp", "TURN-UDP"),
        ("TCP", "TURN-TCP"),
        ("", "TURN-UDP"),
    ],
)
def test_listener_protocol_is_case_insensitive_and_bare_forms_become_turn(
    given: str, expected: str
) -> None:
    assert listener(protocol=given).protocol == expected


@pytest.mark.parametrize("protocol", ["tls", "DTLS", "TURN-TLS", "turn-dtls"])
def test_tls_listener_protocols_are_normalised_too(
    protocol: str, tls_pair: tuple[str, str]
) -> None:
    cert, key = tls_pair
    result = listener(protocol=protocol, cert=cert, key=key).protocol
    assert result == ("TURN-DTLS" if "dtls" in protocol.lower() else "TURN-TLS")


@pytest.mark.parametrize("protocol", ["dummy", "SCTP", "turn-quic"])
def test_unknown_listener_protocol_fails(protocol: str) -> None:
    with pytest.raises(ConfigValidationError, match=f'unknown listener protocol: "{protocol}"'):
        listener(protocol=protocol)


@pytest.mark.parametrize(
    ("given", "expected"),
    [(0, 3478), (1, 1), (65535, 65535), ("23478", 23478), ("0", 3478)],
)
def test_listener_port_zero_defaults_and_decimal_strings_are_accepted(
    given: Any, expected: int
) -> None:
    assert listener(port=given).port == expected


@pytest.mark.parametrize("port", [-1, 65536, 100000])
def test_listener_port_out_of_range_fails(port: int) -> None:
    with pytest.raises(ConfigValidationError, match=f"invalid port: {port}") as info:
        listener(port=port)
    assert info.value.field == "listeners[0].port"


@pytest.mark.parametrize("port", [True, 1.5, "3478x", [1], {"a": 1}, "0x10", "1e3"])
def test_listener_port_that_is_not_an_integer_fails(port: Any) -> None:
    with pytest.raises(ConfigValidationError, match="expected an integer"):
        listener(port=port)


@pytest.mark.parametrize(
    ("given", "expected"),
    [("", "0.0.0.0"), ("localhost", "127.0.0.1"), ("1.2.3.4", "1.2.3.4"), ("::1", "::1")],
)
def test_listener_address_defaults_and_localhost_maps_to_loopback(
    given: str, expected: str
) -> None:
    assert listener(address=given).address == expected


def test_listener_address_placeholder_is_kept_for_later_substitution() -> None:
    cfg = parse_config(
        {"version": "v1", "auth": STATIC_AUTH, "listeners": [{"name": "l", "address": "$ADDR"}]},
        expand_env=False,
    )
    assert cfg.listeners[0].address == "$ADDR"


@pytest.mark.parametrize("port", [-1, 65536])
def test_public_port_out_of_range_fails(port: int) -> None:
    with pytest.raises(ConfigValidationError, match=f"invalid public port: {port}"):
        listener(public_port=port)


@pytest.mark.parametrize("quota", [2**63, -(2**63) - 1, "99999999999999999999"])
def test_integers_beyond_int64_fail(quota: Any) -> None:
    with pytest.raises(ConfigValidationError, match="integer") as info:
        config(admin={"user_quota": quota})
    assert info.value.field == "admin.user_quota"


def test_routes_come_back_sorted() -> None:
    assert listener(routes=["none", "dummy"]).routes == ("dummy", "none")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"protocol": "TURN-TLS", "key": "x"}, "empty TLS cert for TURN-TLS listener"),
        ({"protocol": "TURN-DTLS", "cert": "CERT"}, "empty TLS key for TURN-DTLS listener"),
        ({"protocol": "TLS"}, "empty TLS cert for TURN-TLS listener"),
        ({"protocol": "TURN-TLS", "cert": "!!!!", "key": "KEY"}, "base64-decode error"),
        ({"protocol": "TURN-TLS", "cert": "ZHVtbXkK", "key": "ZHVtbXkK"}, "no PEM CERTIFICATE"),
    ],
)
def test_tls_listener_needs_base64_pem_cert_and_key(
    fields: dict[str, Any], message: str, tls_pair: tuple[str, str]
) -> None:
    cert, _ = tls_pair
    fields = {k: cert if v == "CERT" else v for k, v in fields.items()}
    with pytest.raises(ConfigValidationError, match=message):
        listener(**fields)


def test_tls_listener_key_must_be_a_pem_private_key(tls_pair: tuple[str, str]) -> None:
    cert, _ = tls_pair
    with pytest.raises(ConfigValidationError, match="invalid TLS key: no PEM PRIVATE KEY") as info:
        listener(protocol="TURN-TLS", cert=cert, key=cert)
    assert info.value.field == "listeners[0].key"


def test_tls_material_is_stored_without_line_breaks(tls_pair: tuple[str, str]) -> None:
    cert, key = tls_pair
    wrapped = "\n".join(cert[i : i + 64] for i in range(0, len(cert), 64)) + "\n"
    lis = listener(protocol="TURN-TLS", cert=wrapped, key=key)
    assert lis.cert == cert
    assert base64.b64decode(lis.cert).startswith(b"-----BEGIN CERTIFICATE-----")


def test_plain_listeners_do_not_look_at_cert_or_key() -> None:
    assert listener(protocol="TURN-UDP", cert="not base64!", key="").cert == "not base64!"


@pytest.mark.parametrize(("kind", "key"), [("listener", "listeners"), ("cluster", "clusters")])
def test_listener_or_cluster_without_a_name_fails(kind: str, key: str) -> None:
    for item in ({}, {"name": ""}, {"name": None}):
        with pytest.raises(ConfigValidationError, match=f"missing name in {kind} configuration"):
            config(**{key: [item]})


def test_empty_listener_and_cluster_lists_are_fine() -> None:
    cfg = config(listeners=[], clusters=[])
    assert (cfg.listeners, cfg.clusters) == ((), ())


@pytest.mark.parametrize(("kind", "key"), [("listener", "listeners"), ("cluster", "clusters")])
def test_duplicate_names_fail(kind: str, key: str) -> None:
    with pytest.raises(ConfigValidationError, match=f'duplicate {kind} name: "x"'):
        config(**{key: [{"name": "x"}, {"name": "x"}]})


@pytest.mark.parametrize(
    ("fields", "attr", "expected"),
    [
        ({"type": "static"}, "type", "STATIC"),
        ({"type": "strict_dns"}, "type", "STRICT_DNS"),
        ({"type": ""}, "type", "STATIC"),
        ({"protocol": "udp"}, "protocol", "UDP"),
        ({"protocol": "tcp"}, "protocol", "TCP"),
        ({"protocol": ""}, "protocol", "UDP"),
    ],
)
def test_cluster_type_and_protocol_are_case_insensitive(
    fields: dict[str, str], attr: str, expected: str
) -> None:
    assert getattr(cluster(**fields), attr) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"type": "dummy"}, 'unknown cluster type: "dummy"'),
        ({"protocol": "sctp"}, 'unknown cluster protocol: "sctp"'),
    ],
)
def test_unknown_cluster_type_or_protocol_fails(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigValidationError, match=message):
        cluster(**fields)


def test_static_endpoints_are_normalised_and_sorted() -> None:
    clu = cluster(endpoints=["2.2.2.2/8:<3-4>", "1.2.3.4/16:<1-2>", "1.1.1.1", "10.0.0.1/32"])
    assert clu.endpoints == ("1.1.1.1", "1.2.0.0/16:<1-2>", "10.0.0.1", "2.0.0.0/8:<3-4>")


def test_one_bad_static_endpoint_rejects_the_config() -> None:
    with pytest.raises(ConfigValidationError, match='invalid endpoint "dummy"') as info:
        cluster(endpoints=["1.1.1.1", "dummy"])
    assert info.value.field == "clusters[0].endpoints"


def test_strict_dns_endpoints_are_names_sorted_but_not_parsed() -> None:
    clu = cluster(type="STRICT_DNS", endpoints=["b.example.com", "A.example.com"])
    assert clu.endpoints == ("A.example.com", "b.example.com")


def test_listeners_and_clusters_are_sorted_by_name() -> None:
    cfg = config(
        listeners=[{"name": "b"}, {"name": "a"}, {"name": "c"}],
        clusters=[{"name": "y"}, {"name": "x"}],
    )
    assert [item.name for item in cfg.listeners] == ["a", "b", "c"]
    assert [item.name for item in cfg.clusters] == ["x", "y"]
    assert cfg.listener("b") is cfg.listeners[1]
    assert cfg.cluster("missing") is None


def test_routes_to_missing_clusters_are_legal() -> None:
    assert config(listeners=[{"name": "l", "routes": ["nowhere"]}]).listeners[0].routes == (
        "nowhere",
    )


@pytest.mark.parametrize(
    ("version", "message"),
    [("v2", 'unsupported API version: "v2"'), ("V1", 'unsupported API version: "V1"')],
)
def test_unknown_api_version_fails(version: str, message: str) -> None:
    with pytest.raises(ConfigValidationError, match=message):
        parse_config({"version": version, "auth": STATIC_AUTH})


def test_missing_version_fails() -> None:
    with pytest.raises(ConfigValidationError, match='unsupported API version: ""'):
        parse_config({"auth": STATIC_AUTH})


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("http://a:b", "Port could not be cast"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://a b\x01", "control character"),
        ("http://host/%zz", "invalid URL escape"),
        ("ftp://host:21", "scheme must be http"),
        (":8080", "scheme must be http"),
    ],
)
def test_bad_metrics_or_health_endpoint_urls_fail(endpoint: str, problem: str) -> None:
    with pytest.raises(ConfigValidationError, match=f"invalid metric server.*{problem}"):
        config(admin={"metrics_endpoint": endpoint})
    with pytest.raises(ConfigValidationError, match=f"invalid health-check server.*{problem}"):
        config(admin={"healthcheck_endpoint": endpoint})


def test_unknown_offload_mode_fails() -> None:
    with pytest.raises(ConfigValidationError, match='unknown offload mode: "ebpf"'):
        config(admin={"offload_engine": "ebpf"})


def test_license_config_is_passed_through() -> None:
    cfg = config(admin={"license_config": {"key": "k", "hmac": "h", "extra": 1}})
    assert cfg.admin.license_config is not None
    assert (cfg.admin.license_config.key, cfg.admin.license_config.hmac) == ("k", "h")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"admin": {"name": 5}}, "admin.name"),
        ({"admin": {"offload_interfaces": "eth0"}}, "admin.offload_interfaces"),
        ({"auth": {"credentials": {"username": 1, "password": "p"}}}, "auth.credentials.username"),
        ({"auth": {"credentials": ["u", "p"]}}, "auth.credentials"),
        ({"listeners": [{"name": "l", "routes": "a"}]}, "listeners[0].routes"),
        ({"listeners": {"name": "l"}}, "listeners"),
        ({"listeners": ["l"]}, "listeners[0]"),
        ({"clusters": [{"name": "c", "endpoints": [1]}]}, "clusters[0].endpoints[0]"),
    ],
)
def test_wrong_types_fail_with_the_field_path(data: dict[str, Any], field: str) -> None:
    full = {"version": "v1", "auth": STATIC_AUTH, **data}
    with pytest.raises(ConfigValidationError) as info:
        parse_config(full)
    assert info.value.field == field
    assert field in str(info.value)


def test_validation_reports_the_first_error_in_upstream_order() -> None:
    data = {
        "version": "v1",
        "admin": {"offload_engine": "bad"},
        "auth": {"type": "bad"},
        "listeners": [{"name": "l", "protocol": "bad"}],
    }
    with pytest.raises(ConfigValidationError, match="unknown offload mode"):
        parse_config(data)


def test_direct_construction_validates_and_raises_config_errors() -> None:
    lis = ListenerConfig(name="l", protocol="TURN-UDP", routes=("b", "a"))
    assert lis.routes == ("a", "b")
    with pytest.raises(ConfigValidationError, match="unknown listener protocol"):
        ListenerConfig.model_validate({"name": "l", "protocol": "x"})
    with pytest.raises(ConfigValidationError, match="static: empty username or password"):
        AuthConfig()
    with pytest.raises(ConfigParseError, match="not JSON"):
        StunnerConfig.model_validate_json("{not json")
    with pytest.raises(ConfigValidationError, match="unsupported API version"):
        StunnerConfig.model_validate_json('{"version": "v2", "auth": {"type": "none"}}')


def test_model_copy_with_update_normalises_again() -> None:
    lis = listener()
    changed = lis.model_copy(update={"protocol": "tcp", "routes": ["z", "a"]})
    assert (changed.protocol, changed.routes) == ("TURN-TCP", ("a", "z"))
    with pytest.raises(ConfigValidationError, match="invalid port"):
        lis.model_copy(update={"port": 70000})


def test_models_are_frozen_and_hashable() -> None:
    cfg = config(listeners=[{"name": "l"}])
    with pytest.raises(AttributeError, match="frozen"):
        cfg.listeners[0].port = 1  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen"):
        del cfg.auth.realm
    assert hash(cfg) == hash(config(listeners=[{"name": "l"}]))
    assert len({cfg, config(listeners=[{"name": "l"}])}) == 1


def test_equal_configs_written_differently_are_equal_and_same_bytes() -> None:
    one = parse_config(
        {
            "version": "v1",
            "auth": {"type": "plaintext", "credentials": {"password": "p", "username": "u"}},
            "listeners": [
                {"name": "b", "protocol": "udp", "port": 0, "routes": ["y", "x"]},
                {"name": "a", "protocol": "TURN-TCP"},
            ],
            "clusters": [{"name": "x", "endpoints": ["10.0.0.9/8", "1.2.3.4"]}],
        }
    )
    two = parse_config(
        {
            "Version": "v1",
            "Auth": {"Credentials": {"username": "u", "password": "p"}, "Type": "static"},
            "Listeners": [
                {"Name": "a", "Protocol": "turn-tcp", "Port": 3478},
                {"Name": "b", "Routes": ["x", "y"], "unknownKey": 1},
            ],
            "Clusters": [{"NAME": "x", "ENDPOINTS": ["1.2.3.4/32", "10.0.0.0/8:<1-65535>"]}],
        }
    )
    assert one == two
    assert one.canonical_json() == two.canonical_json()


def test_canonical_json_is_compact_with_sorted_keys() -> None:
    text = config(listeners=[{"name": "l"}]).canonical_json()
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert list(data) == ["admin", "auth", "clusters", "listeners", "version"]
    assert data == config(listeners=[{"name": "l"}]).to_dict()


def test_copies_and_pickles_are_equal_models() -> None:
    cfg = config(listeners=[{"name": "l", "routes": ["a"]}], clusters=[{"name": "a"}])
    for twin in (copy.copy(cfg), copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert twin == cfg
        assert twin.canonical_json() == cfg.canonical_json()
    assert cfg.model_copy() == cfg


def test_model_construct_fills_defaults_and_checks_nothing() -> None:
    lis = ListenerConfig.model_construct(name="l", port=0)
    assert (lis.port, lis.protocol, lis.routes) == (0, "TURN-UDP", ())


def test_an_instance_is_taken_as_it_is_and_other_types_are_refused() -> None:
    cfg = config()
    assert StunnerConfig.model_validate(cfg) is cfg
    assert cfg != cfg.to_dict()
    with pytest.raises(ConfigValidationError, match="valid dictionary or instance of") as info:
        StunnerConfig.model_validate([1])
    assert info.value.field == ""


def test_the_config_models_load_without_pydantic() -> None:
    # Every stunnerd process holds these models; pydantic would be most of its idle memory.
    modules = modules_after(
        "from stunner_common.config import parse_config\n"
        "parse_config({'version': 'v1', 'auth': {'type': 'none'},"
        " 'listeners': [{'name': 'l'}], 'clusters': [{'name': 'c', 'endpoints': ['10.0.0.1']}]})"
    )
    assert "stunner_common.config.model" in modules
    assert roots(modules) & {"pydantic", "pydantic_core"} == set()
