"""The settings step every service's command shares: flags over the environment, one-line errors."""

from __future__ import annotations

import argparse
import logging

import pytest
from pydantic_settings import BaseSettings, SettingsConfigDict

from stunner_common.process_settings import settings_from_args


class DemoSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DEMO_")

    port: int = 1
    password: str = ""
    log_level: str = "INFO"
    log_format: str = "text"


def _args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**values)


def test_flags_given_override_the_environment_and_absent_flags_leave_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEMO_PORT", "7")
    monkeypatch.setenv("DEMO_LOG_LEVEL", "DEBUG")
    settings = settings_from_args(
        "demo", DemoSettings, _args(port=None, log_level="WARNING"), ("port", "log_level")
    )
    assert settings is not None
    assert settings.port == 7
    assert settings.log_level == "WARNING"
    assert logging.getLogger().level == logging.WARNING


def test_a_bad_value_is_one_line_without_the_input_and_gives_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = settings_from_args(
        "demo", DemoSettings, _args(port="not-a-port", password="s3cret"), ("port", "password")
    )
    assert settings is None
    err = capsys.readouterr().err
    assert err.startswith("demo: invalid settings: port:")
    assert err.count("\n") == 1
    assert "not-a-port" not in err


def test_a_bad_log_format_is_reported_and_gives_none(capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings_from_args("demo", DemoSettings, _args(log_format="xml"), ("log_format",))
    assert settings is None
    assert capsys.readouterr().err.startswith("demo: ")
