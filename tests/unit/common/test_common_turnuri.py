"""TURN URIs: parsing, the default config, listener URIs."""

from __future__ import annotations

import base64

import pytest

from stunner_common.config import (
    ConfigValidationError,
    ListenerConfig,
    is_zero_config,
    load_tls_pair,
    parse_config,
    self_signed_pair,
)
from stunner_common.turnuri import (
    TurnUri,
    default_config_from_uri,
    listener_turn_uri,
    parse_turn_uri,
)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "turn://user:pass@1.2.3.4:3478?transport=udp",
            TurnUri("turn", "1.2.3.4", 3478, "udp", "TURN-UDP", "user", "pass"),
        ),
        ("turn:1.2.3.4:3478", TurnUri("turn", "1.2.3.4", 3478, "udp", "TURN-UDP")),
        ("turn:1.2.3.4", TurnUri("turn", "1.2.3.4", 3478, "udp", "TURN-UDP")),
        ("turn:1.2.3.4?transport=tcp", TurnUri("turn", "1.2.3.4", 3478, "tcp", "TURN-TCP")),
        ("turn:1.2.3.4?transport=tls", TurnUri("turn", "1.2.3.4", 443, "tls", "TURN-TLS")),
        ("turn:1.2.3.4?transport=dtls", TurnUri("turn", "1.2.3.4", 443, "dtls", "TURN-DTLS")),
        ("turns:1.2.3.4", TurnUri("turns", "1.2.3.4", 443, "udp", "TURN-DTLS")),
        ("turns:1.2.3.4?transport=udp", TurnUri("turns", "1.2.3.4", 443, "udp", "TURN-DTLS")),
        ("turns:1.2.3.4?transport=tcp", TurnUri("turns", "1.2.3.4", 443, "tcp", "TURN-TLS")),
        ("turns:1.2.3.4?transport=tls", TurnUri("turns", "1.2.3.4", 443, "tls", "TURN-TLS")),
        ("turns:1.2.3.4?transport=dtls", TurnUri("turns", "1.2.3.4", 443, "dtls", "TURN-DTLS")),
        ("turns:1.2.3.4:5349", TurnUri("turns", "1.2.3.4", 5349, "udp", "TURN-DTLS")),
        ("turn:1.2.3.4:3479?transport=TLS", TurnUri("turn", "1.2.3.4", 3479, "tls", "TURN-TLS")),
        (
            "TURN:host.example:80?transport=tcp",
            TurnUri("turn", "host.example", 80, "tcp", "TURN-TCP"),
        ),
        ("turn:[::1]:5000", TurnUri("turn", "::1", 5000, "udp", "TURN-UDP")),
        (
            "turn://u:p@[2001:db8::1]",
            TurnUri("turn", "2001:db8::1", 3478, "udp", "TURN-UDP", "u", "p"),
        ),
        (
            "turn://us%40er:pa%3As%24s@1.2.3.4:3478",
            TurnUri("turn", "1.2.3.4", 3478, "udp", "TURN-UDP", "us@er", "pa:s$s"),
        ),
        (
            "turn://user:pass@1.2.3.4:3478?transport=tcp&other=1",
            TurnUri("turn", "1.2.3.4", 3478, "tcp", "TURN-TCP", "user", "pass"),
        ),
        ("://u:p@1.2.3.4", TurnUri("turn", "1.2.3.4", 3478, "udp", "TURN-UDP", "u", "p")),
        ("turn:user@1.2.3.4", TurnUri("turn", "1.2.3.4", 3478, "udp", "TURN-UDP", "user", None)),
    ],
)
def test_turn_uris_parse_with_upstream_defaults(uri: str, expected: TurnUri) -> None:
    assert parse_turn_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("http://1.2.3.4:3478", 'unsupported scheme "http"'),
        ("stun:1.2.3.4", 'unsupported scheme "stun"'),
        ("1.2.3.4:3478", "expected turn:"),
        ("host:3478", 'unsupported scheme "host"'),
        ("turn:", "missing host"),
        ("turn://u:p@:3478", "missing host"),
        ("turn:1.2.3.4:0", 'invalid port "0"'),
        ("turn:1.2.3.4:65536", 'invalid port "65536"'),
        ("turn:1.2.3.4:abc", 'invalid port "abc"'),
        ("turn:1.2.3.4?transport=sctp", 'unknown transport "sctp"'),
        ("turn:[::1", "unterminated"),
        ("turn:[nothex]:1", "not an IPv6 address"),
        ("turn:1:2:3:zz", "must be written in brackets"),
        ("", "expected turn:"),
        ("turn:ho st:3478", 'invalid host "ho st"'),
        ("turn:-bad-:3478", 'invalid host "-bad-"'),
        ("turn:a%20b", 'invalid host "a%20b"'),
    ],
)
def test_bad_turn_uris_fail_with_a_clear_message(uri: str, problem: str) -> None:
    with pytest.raises(ConfigValidationError, match=problem):
        parse_turn_uri(uri)


def test_uri_string_form_hides_the_password() -> None:
    uri = parse_turn_uri("turn://user:secret@[::1]:3478?transport=tcp")
    assert str(uri) == "turn:[::1]:3478?transport=tcp"
    assert "secret" not in repr(uri)


def test_default_config_from_a_udp_uri_matches_upstream() -> None:
    cfg = default_config_from_uri("turn://user1:passwd1@1.2.3.4:3478?transport=udp")
    assert cfg.admin.healthcheck_endpoint == "http://:8086"
    assert cfg.admin.metrics_endpoint == ""
    assert (cfg.auth.type, cfg.auth.realm) == ("static", "stunner.l7mp.io")
    assert cfg.auth.credentials == {"username": "user1", "password": "passwd1"}
    [lis] = cfg.listeners
    assert (lis.name, lis.protocol, lis.address, lis.port) == (
        "default-listener",
        "TURN-UDP",
        "1.2.3.4",
        3478,
    )
    assert lis.routes == ("allow-any",)
    [clu] = cfg.clusters
    assert (clu.name, clu.type, clu.endpoints) == ("allow-any", "STATIC", ("0.0.0.0/0",))
    assert not is_zero_config(cfg)
    assert parse_config(cfg.canonical_json()) == cfg


@pytest.mark.parametrize(
    ("uri", "protocol", "port"),
    [
        ("turn://u:p@127.0.0.1?transport=tcp", "TURN-TCP", 3478),
        ("turns://u:p@127.0.0.1?transport=tcp", "TURN-TLS", 443),
        ("turns://u:p@127.0.0.1", "TURN-DTLS", 443),
        ("turn://u:p@localhost:5349?transport=tls", "TURN-TLS", 5349),
    ],
)
def test_default_config_for_tls_and_dtls_carries_a_working_self_signed_pair(
    uri: str, protocol: str, port: int
) -> None:
    [lis] = default_config_from_uri(uri).listeners
    assert (lis.protocol, lis.port, lis.address) == (protocol, port, "127.0.0.1")
    if protocol in ("TURN-TLS", "TURN-DTLS"):
        pair = load_tls_pair(lis.cert, lis.key)
        assert pair.cert_pem.startswith(b"-----BEGIN CERTIFICATE-----")
    else:
        assert (lis.cert, lis.key) == ("", "")


def test_default_config_accepts_a_parsed_uri() -> None:
    uri = parse_turn_uri("turn://u:p@10.0.0.1:3478")
    assert default_config_from_uri(uri) == default_config_from_uri("turn://u:p@10.0.0.1:3478")


@pytest.mark.parametrize(
    "uri",
    ["turn:1.2.3.4:3478", "turn://user@1.2.3.4", "turn://:pass@1.2.3.4", "turn://user:@1.2.3.4"],
)
def test_default_config_needs_username_and_password(uri: str) -> None:
    with pytest.raises(ConfigValidationError, match="username/password must be set"):
        default_config_from_uri(uri)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {
                "address": "127.0.0.1",
                "port": 23478,
                "public_address": "1.2.3.4",
                "public_port": 3478,
            },
            "turn:1.2.3.4:3478?transport=udp",
        ),
        ({"address": "127.0.0.1", "port": 23478}, "turn:127.0.0.1:23478?transport=udp"),
        ({"protocol": "TURN-TCP", "public_address": "1.2.3.4"}, "turn:1.2.3.4:3478?transport=tcp"),
        ({"address": "__node_address_placeholder"}, "turn:0.0.0.0:3478?transport=udp"),
        (
            {"public_address": "2001:db8::1", "public_port": 443},
            "turn:[2001:db8::1]:443?transport=udp",
        ),
        ({"protocol": "udp"}, "turn:0.0.0.0:3478?transport=udp"),
    ],
)
def test_listener_uri_prefers_the_public_address_and_port(
    fields: dict[str, object], expected: str
) -> None:
    assert listener_turn_uri(ListenerConfig.model_validate({"name": "l", **fields})) == expected


@pytest.mark.parametrize(
    ("protocol", "expected"),
    [
        ("TURN-TLS", "turns:1.2.3.4:443?transport=tcp"),
        ("TURN-DTLS", "turns:1.2.3.4:443?transport=udp"),
    ],
)
def test_listener_uri_for_tls_and_dtls_uses_turns(protocol: str, expected: str) -> None:
    cert, key = self_signed_pair("1.2.3.4")
    lis = ListenerConfig.model_validate(
        {
            "name": "l",
            "protocol": protocol,
            "port": 443,
            "public_address": "1.2.3.4",
            "cert": cert,
            "key": key,
        }
    )
    assert listener_turn_uri(lis) == expected
    assert parse_turn_uri(expected).protocol == protocol
    assert base64.b64decode(lis.key).startswith(b"-----BEGIN PRIVATE KEY-----")


@pytest.mark.parametrize(
    ("host", "endpoints"),
    [
        ("1.2.3.4", ("0.0.0.0/0",)),
        ("127.0.0.1", ("0.0.0.0/0", "127.0.0.0/8")),
        ("[::1]", ("0.0.0.0/0", "::1")),
    ],
)
def test_a_loopback_uri_names_loopback_peers_explicitly(
    host: str, endpoints: tuple[str, ...]
) -> None:
    """stunnerd refuses loopback peers unless a route names them; a local URI names them."""
    cfg = default_config_from_uri(f"turn://u:p@{host}:3478?transport=udp")
    assert cfg.clusters[0].endpoints == endpoints
