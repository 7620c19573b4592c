"""Picking the listener and the credentials out of a CDS config, and the CDS address forms."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from stunner_common.auth import ephemeral_password
from stunner_common.config import parse_config
from turncat.cds import cds_base_url, credential_source, pick_listener
from turncat.errors import LookupFailedError
from turncat.uri import K8sTarget

TARGET = K8sTarget("stunner", "udp-gateway", "udp-listener")


def config(auth: dict[str, Any], *names: str) -> Any:
    return parse_config(
        {
            "version": "v1",
            "admin": {"name": "stunner/udp-gateway"},
            "auth": auth,
            "listeners": [
                {"name": n, "protocol": "TURN-UDP", "port": 3478 + i, "routes": []}
                for i, n in enumerate(names)
            ],
            "clusters": [],
        }
    )


STATIC = {"type": "static", "credentials": {"username": "u", "password": "p"}}


def test_listener_is_found_by_its_third_name_segment() -> None:
    cfg = config(STATIC, "stunner/udp-gateway/tcp-listener", "stunner/udp-gateway/udp-listener")
    assert pick_listener(cfg, TARGET).name == "stunner/udp-gateway/udp-listener"


def test_missing_listener_lists_the_ones_there_are() -> None:
    cfg = config(STATIC, "stunner/udp-gateway/tcp-listener")
    with pytest.raises(LookupFailedError, match=r"no listener 'udp-listener'.*tcp-listener"):
        pick_listener(cfg, TARGET)


def test_static_credentials_come_from_the_config() -> None:
    assert credential_source(config(STATIC))() == ("u", "p")


def test_ephemeral_credentials_are_minted_from_the_secret_per_call() -> None:
    source = credential_source(
        config({"type": "ephemeral", "credentials": {"secret": "my-secret"}})
    )
    result = source()
    assert result is not None
    user, password = result
    assert user.isdigit()
    assert password == ephemeral_password("my-secret", user)


def test_auth_none_needs_no_credentials() -> None:
    assert credential_source(config({"type": "none", "credentials": {}}))() is None


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"type": "static", "credentials": {"username": "u"}}, "lacks username or password"),
        ({"type": "ephemeral", "credentials": {}}, "lacks the secret"),
    ],
)
def test_incomplete_auth_sections_are_reported(auth: dict[str, Any], message: str) -> None:
    # The config parser refuses these already; the check stands guard behind it.
    cfg = SimpleNamespace(auth=SimpleNamespace(**auth))
    with pytest.raises(LookupFailedError, match=message):
        credential_source(cfg)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.7", "http://10.0.0.7:13478"),
        ("10.0.0.7:8080", "http://10.0.0.7:8080"),
        ("http://cds.example:8080/", "http://cds.example:8080"),
        ("https://cds.example", "https://cds.example"),
    ],
)
def test_cds_address_forms(address: str, expected: str) -> None:
    assert cds_base_url(address) == expected


def test_cds_address_with_another_scheme_is_rejected() -> None:
    with pytest.raises(LookupFailedError, match="invalid CDS address"):
        cds_base_url("ftp://cds")
