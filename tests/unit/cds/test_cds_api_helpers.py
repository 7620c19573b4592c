"""Small pure pieces of the CDS API: Go booleans, settings from the environment, CLI flags."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stunner_cds.__main__ import parse_args
from stunner_cds.api.common import parse_go_bool
from stunner_cds.settings import DEFAULT_PORT, CdsSettings
from stunner_common.io.http import ApiError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("1", True),
        ("t", True),
        ("T", True),
        ("TRUE", True),
        ("true", True),
        ("True", True),
        ("0", False),
        ("f", False),
        ("F", False),
        ("FALSE", False),
        ("false", False),
        ("False", False),
    ],
)
def test_watch_accepts_exactly_what_go_parsebool_accepts(value: str | None, expected: bool) -> None:
    assert parse_go_bool("watch", value) is expected


@pytest.mark.parametrize("value", ["", "yes", "on", "tRUE", "2", " true"])
def test_other_watch_values_are_a_400_naming_the_parameter(value: str) -> None:
    with pytest.raises(ApiError) as error:
        parse_go_bool("watch", value)
    assert error.value.code == 400
    assert "parameter watch" in error.value.message


def test_settings_default_to_upstreams_port_on_all_interfaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("CDS_HOST", "CDS_PORT", "REDIS_URL", "CDS_REDIS_URL", "CDS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    settings = CdsSettings()
    assert (settings.host, settings.port) == ("0.0.0.0", DEFAULT_PORT)
    assert settings.token is None


def test_settings_read_cds_prefixed_env_and_plain_redis_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CDS_HOST", "127.0.0.1")
    monkeypatch.setenv("CDS_PORT", "23478")
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/1")
    monkeypatch.setenv("CDS_TOKEN", "s3cret")
    settings = CdsSettings()
    assert (settings.host, settings.port) == ("127.0.0.1", 23478)
    assert settings.redis_url == "redis://redis:6379/1"
    assert settings.token is not None
    assert settings.token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    "bad",
    [
        {"port": 70000},
        {"queue_size": 0},
        {"ping_interval_s": 0},
        {"tls_cert_file": "c.pem"},
        {"v1_min_interval_s": -0.1},
        {"v1_min_interval_s": "soon"},
    ],
)
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CdsSettings(**bad)  # type: ignore[arg-type]


def test_v1_frames_are_held_a_quarter_second_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert CdsSettings().v1_min_interval_s == 0.25  # upstream's render throttle
    monkeypatch.setenv("CDS_V1_MIN_INTERVAL_S", "0")
    assert CdsSettings().v1_min_interval_s == 0


def test_cli_flags_match_the_documented_command() -> None:
    args = parse_args(["--host", "h", "--port", "1", "--redis-url", "redis://x"])
    assert (args.host, args.port, args.redis_url) == ("h", 1, "redis://x")


def test_a_reconnect_floor_above_the_ceiling_is_refused() -> None:
    with pytest.raises(ValueError, match="reconnect_min_s must not exceed reconnect_max_s"):
        CdsSettings(reconnect_min_s=3.0, reconnect_max_s=2.0)
