"""The auth service's settings read the CDS address as every tool does (flag, CDS_SERVER_ADDR,
then the deprecated names with a warning) and refuse an address no client could use."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stunner_auth.settings import AuthSettings

ADDRESS_ENVS = ("CDS_SERVER_ADDR", "STUNNER_CDS_ADDR", "AUTH_CDS_URL")


@pytest.fixture(autouse=True)
def _no_address_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ADDRESS_ENVS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("env", "flag", "address", "warnings"),
    [
        ({}, None, "127.0.0.1:13478", ()),
        ({"CDS_SERVER_ADDR": "cds:1"}, None, "cds:1", ()),
        (
            {"AUTH_CDS_URL": "old:1"},
            None,
            "old:1",
            ("AUTH_CDS_URL is deprecated: set CDS_SERVER_ADDR instead",),
        ),
        (
            {"CDS_SERVER_ADDR": "cds:1", "AUTH_CDS_URL": "old:1"},
            None,
            "cds:1",
            ("AUTH_CDS_URL=old:1 is ignored: the CDS address comes from CDS_SERVER_ADDR",),
        ),
        ({"CDS_SERVER_ADDR": "cds:1"}, "http://flag:2", "http://flag:2", ()),
    ],
)
def test_the_cds_address_comes_from_the_flag_then_the_shared_variable_then_old_names(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    flag: str | None,
    address: str,
    warnings: tuple[str, ...],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = AuthSettings() if flag is None else AuthSettings(cds_url=flag)
    assert (settings.cds_url, settings.warnings) == (address, warnings)


def test_the_token_file_comes_from_cds_token_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDS_TOKEN_FILE", "/run/secrets/cds-token")
    assert AuthSettings().cds_token_file == "/run/secrets/cds-token"


def test_an_unusable_cds_address_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"invalid CDS address 'http://\[::1'"):
        AuthSettings(cds_url="http://[::1")
