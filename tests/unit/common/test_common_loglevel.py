"""Upstream log-level specs mapped to Python logging."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from stunner_common.loglevel import (
    DISABLE,
    TRACE,
    apply_log_spec,
    parse_log_spec,
    register_log_scope,
    reset_log_spec,
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all:INFO", {"all": logging.INFO}),
        ("all:INFO,turn:DEBUG", {"all": logging.INFO, "turn": logging.DEBUG}),
        ("turn:DEBUG,all:WARN", {"all": logging.WARNING}),
        ("ALL:debug", {"all": logging.DEBUG}),
        ("turn:trace,auth:disable", {"turn": TRACE, "auth": DISABLE}),
        ("turn:error, admin : Info ", {"turn": logging.ERROR, "admin": logging.INFO}),
        ("turn", {}),
        ("turn:LOUD,auth:WARN", {"auth": logging.WARNING}),
        (":INFO,,all:", {}),
        ("", {}),
        ("turn:INFO,turn:ERROR", {"turn": logging.ERROR}),
        ("listener-udp:DEBUG", {"listener-udp": logging.DEBUG}),
    ],
)
def test_specs_parse_left_to_right_skipping_malformed_entries(
    spec: str, expected: dict[str, int]
) -> None:
    assert parse_log_spec(spec) == expected


@pytest.fixture
def clean_levels() -> Iterator[None]:
    reset_log_spec()
    yield
    reset_log_spec()


def level(name: str) -> int:
    return logging.getLogger(name).level


def test_apply_sets_project_loggers_and_scoped_loggers(clean_levels: None) -> None:
    root_before = logging.getLogger().level
    apply_log_spec("all:WARN,turn:DEBUG")
    assert level("stunnerd") == logging.WARNING
    assert level("stunner_cds") == logging.WARNING
    assert level("stunnerd.turn") == logging.DEBUG
    assert logging.getLogger().level == root_before


def test_specs_are_cumulative_until_all_resets_the_scopes(clean_levels: None) -> None:
    apply_log_spec("all:INFO,turn:DEBUG")
    apply_log_spec("auth.module:ERROR")
    assert level("stunnerd.turn") == logging.DEBUG
    assert level("auth.module") == logging.ERROR
    apply_log_spec("all:WARN")
    assert level("stunnerd.turn") == logging.NOTSET
    assert level("auth.module") == logging.NOTSET
    assert logging.getLogger("stunnerd.turn").getEffectiveLevel() == logging.WARNING


def test_registered_scopes_map_to_their_loggers(clean_levels: None) -> None:
    register_log_scope("reconciler-test", ["stunnerd.reconcile_test"])
    apply_log_spec("reconciler-test:TRACE")
    assert level("stunnerd.reconcile_test") == TRACE
    assert logging.getLevelName(TRACE) == "TRACE"


def test_disable_silences_a_scope(clean_levels: None) -> None:
    apply_log_spec("turn:DISABLE")
    assert not logging.getLogger("stunnerd.turn.engine").isEnabledFor(logging.CRITICAL)
