"""TLS material loading and the zero (deleted) config."""

from __future__ import annotations

import base64

import pytest
from cryptography import x509

from stunner_common.config import (
    ConfigValidationError,
    is_zero_config,
    load_tls_pair,
    parse_config,
    self_signed_pair,
    zero_config,
)

UPSTREAM_ZERO_WIRE = (
    '{"version":"v1","admin":{"name":"ns1/gw2"},"auth":{"type":"static","realm":"stunner.l7mp.io",'
    '"credentials":{"password":"dummy-password","username":"dummy-username"}}}'
)


@pytest.fixture(scope="module")
def pair() -> tuple[str, str]:
    return self_signed_pair("127.0.0.1")


@pytest.fixture(scope="module")
def other_pair() -> tuple[str, str]:
    return self_signed_pair("example.com")


def test_a_matching_pair_loads_to_pem_bytes(pair: tuple[str, str]) -> None:
    cert, key = pair
    loaded = load_tls_pair(cert, key)
    assert loaded.cert_pem == base64.b64decode(cert)
    assert loaded.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")


def test_a_key_from_another_pair_is_refused(
    pair: tuple[str, str], other_pair: tuple[str, str]
) -> None:
    with pytest.raises(ConfigValidationError, match="cannot load cert/key pair: private key"):
        load_tls_pair(pair[0], other_pair[1])


@pytest.mark.parametrize(
    ("cert", "key", "problem"),
    [
        ("ZHVtbXkK", "ZHVtbXkK", "no PEM CERTIFICATE"),
        ("!!", "ZHVtbXkK", "base64-decode error"),
        ("CERT", "!!", "base64-decode error"),
        (
            base64.b64encode(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
            "KEY",
            "cannot load cert/key pair",
        ),
        (
            "CERT",
            base64.b64encode(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
            "cannot load cert/key pair",
        ),
    ],
)
def test_broken_material_raises_cannot_load_pair(
    cert: str | bytes, key: str | bytes, problem: str, pair: tuple[str, str]
) -> None:
    def pick(value: str | bytes, real: str) -> str:
        if isinstance(value, bytes):
            return value.decode()
        return real if value in ("CERT", "KEY") else value

    with pytest.raises(ConfigValidationError, match=problem):
        load_tls_pair(pick(cert, pair[0]), pick(key, pair[1]))


def test_self_signed_pair_names_a_dns_host(other_pair: tuple[str, str]) -> None:
    cert = x509.load_pem_x509_certificate(base64.b64decode(other_pair[0]))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["example.com"]


def test_zero_config_has_the_dummy_static_credentials_and_nothing_else() -> None:
    zero = zero_config("ns/gw")
    assert zero.admin.name == "ns/gw"
    assert zero.admin.loglevel == "all:INFO"
    assert zero.admin.healthcheck_endpoint == "http://:8086"
    assert zero.auth.type == "static"
    assert zero.auth.realm == "stunner.l7mp.io"
    assert zero.auth.credentials == {"username": "dummy-username", "password": "dummy-password"}
    assert (zero.listeners, zero.clusters) == ((), ())
    assert is_zero_config(zero)


def test_the_upstream_delete_frame_is_recognised_as_the_zero_config() -> None:
    cfg = parse_config(UPSTREAM_ZERO_WIRE)
    assert cfg == zero_config("ns1/gw2")
    assert is_zero_config(cfg)


def test_zero_config_with_another_loglevel_is_still_zero() -> None:
    cfg = parse_config(UPSTREAM_ZERO_WIRE.replace('"ns1/gw2"', '"ns1/gw2","loglevel":"all:DEBUG"'))
    assert is_zero_config(cfg)


@pytest.mark.parametrize(
    "change",
    [
        ('"dummy-password"', '"other"'),
        ('"stunner.l7mp.io"', '"other.realm"'),
        ('"static"', '"plaintext"'),
        ('"ns1/gw2"}', '"ns1/gw2","healthcheck_endpoint":""}'),
        ('"ns1/gw2"}', '"ns1/gw2","user_quota":3}'),
        ('"auth"', '"listeners":[{"name":"l"}],"auth"'),
        ('"auth"', '"clusters":[{"name":"c"}],"auth"'),
    ],
)
def test_anything_else_is_not_the_zero_config(change: tuple[str, str]) -> None:
    cfg = parse_config(UPSTREAM_ZERO_WIRE.replace(*change))
    # plaintext is only an alias of static: that one still is the zero config
    assert is_zero_config(cfg) is (change[1] == '"plaintext"')
