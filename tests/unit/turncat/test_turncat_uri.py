"""turncat's address parsing: every accepted form and every rejected one, with no I/O."""

from __future__ import annotations

import pytest

from turncat.errors import EXIT_BAD_INPUT, BadInputError
from turncat.uri import (
    K8sTarget,
    LocalAddress,
    PeerAddress,
    TurnTarget,
    parse_local,
    parse_peer,
    parse_server,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("udp://127.0.0.1:9000", LocalAddress("udp", "127.0.0.1", 9000)),
        ("tcp://127.0.0.1:9001", LocalAddress("tcp", "127.0.0.1", 9001)),
        ("UDP://localhost:9000", LocalAddress("udp", "localhost", 9000)),
        ("udp://:9000", LocalAddress("udp", "0.0.0.0", 9000)),
        ("udp://[::1]:9000", LocalAddress("udp", "::1", 9000)),
        ("-", LocalAddress("stdio")),
    ],
)
def test_local_address_forms_are_accepted(text: str, expected: LocalAddress) -> None:
    assert parse_local(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("unix:///tmp/sock", "expected udp://host:port"),
        ("http://127.0.0.1:80", "expected udp://host:port"),
        ("udp://127.0.0.1", "a port is required"),
        ("udp://127.0.0.1:0", "a port is required"),
        ("udp://127.0.0.1:99999", "invalid local address"),
        ("udp://127.0.0.1:90/path", "expected udp://host:port"),
        ("127.0.0.1:9000", "expected udp://host:port"),
        ("", "expected udp://host:port"),
    ],
)
def test_bad_local_addresses_are_rejected_with_the_text_named(text: str, message: str) -> None:
    with pytest.raises(BadInputError, match=message) as info:
        parse_local(text)
    assert repr(text) in str(info.value)
    assert info.value.exit_code == EXIT_BAD_INPUT


def test_peer_address_needs_udp_or_tcp_scheme_host_and_port() -> None:
    assert parse_peer("udp://10.0.0.5:5000") == PeerAddress("10.0.0.5", 5000)
    assert parse_peer("tcp://10.0.0.5:5000") == PeerAddress("10.0.0.5", 5000, "tcp")
    assert parse_peer("udp://[::1]:5000") == PeerAddress("::1", 5000)
    assert parse_peer("TCP://[fd00::5]:80") == PeerAddress("fd00::5", 80, "tcp")
    for bad in (
        "sctp://10.0.0.5:5000",
        "udp://:5000",
        "udp://10.0.0.5",
        "tcp://[::1]",
        "10.0.0.5:5000",
        "udp://[::1:5000",
    ):
        with pytest.raises(BadInputError, match="peer address"):
            parse_peer(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "turn://user1:passwd1@127.0.0.1:3478?transport=udp",
            TurnTarget("127.0.0.1", 3478, "udp", "user1", "passwd1"),
        ),
        (
            "turn://user1:passwd1@127.0.0.1:3478?transport=tcp",
            TurnTarget("127.0.0.1", 3478, "tcp", "user1", "passwd1"),
        ),
        (
            "turn://u:p@example.com?transport=tls",
            TurnTarget("example.com", 443, "tls", "u", "p"),
        ),
        (
            "turn://u:p@example.com:5349?transport=dtls",
            TurnTarget("example.com", 5349, "dtls", "u", "p"),
        ),
        ("turns://u:p@h:5349?transport=tcp", TurnTarget("h", 5349, "tls", "u", "p")),
        ("turns://u:p@h:5349?transport=udp", TurnTarget("h", 5349, "dtls", "u", "p")),
        ("turn://u:p@h", TurnTarget("h", 3478, "udp", "u", "p")),
        ("turn://u%40x:p%2Fq@h:1", TurnTarget("h", 1, "udp", "u@x", "p/q")),
    ],
)
def test_turn_uris_give_host_port_transport_and_credentials(
    text: str, expected: TurnTarget
) -> None:
    assert parse_server(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://u:p@h:3478", "unknown scheme 'http'"),
        ("stun://h:3478", "unknown scheme 'stun'"),
        ("h:3478", "unknown scheme 'h'"),
        ("turn://h:3478?transport=udp", "username and password must be set"),
        ("turn://user@h:3478", "username and password must be set"),
        ("turn://:pass@h:3478", "username and password must be set"),
        ("turn://u:p@h:3478?transport=sctp", "unknown transport"),
        ("turn://u:p@h:notaport", "invalid port"),
        ("turn://u:p@:3478", "missing host"),
        ("k8s://ns-only", "expected k8s://namespace/gateway:listener"),
        ("k8s://ns/gw", "expected k8s://namespace/gateway:listener"),
        ("k8s://ns/gw:", "bad listener name"),
        ("k8s://ns/g w:l", "bad gateway name"),
        ("k8s:ns/gw:l", "expected k8s://"),
    ],
)
def test_bad_server_uris_are_rejected_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        parse_server(text)


def test_k8s_uri_names_namespace_gateway_and_listener() -> None:
    assert parse_server("k8s://stunner/udp-gateway:udp-listener") == K8sTarget(
        "stunner", "udp-gateway", "udp-listener"
    )
    assert parse_server("k8s:///gw:l", default_namespace="team-a") == K8sTarget("team-a", "gw", "l")
