"""The one log set-up: text and the one JSON schema, handlers replaced, bad input refused."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from stunner_common.logs import JsonFormatter, configure_logging, text_formatter


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    return logging.LogRecord("stunnerd.x", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_the_json_schema_has_ts_level_logger_msg() -> None:
    line = json.loads(JsonFormatter().format(_record("hello %s", "w")))
    assert set(line) == {"ts", "level", "logger", "msg"}
    assert (line["level"], line["logger"], line["msg"]) == ("WARNING", "stunnerd.x", "hello w")
    assert isinstance(line["ts"], float)


def test_json_carries_the_tag_and_the_traceback_when_there_are_some() -> None:
    line = json.loads(JsonFormatter(tag="worker-2").format(_record("x", exc=True)))
    assert line["tag"] == "worker-2"
    assert "RuntimeError: boom" in line["exc"]


def test_the_text_format_names_time_level_logger_and_tag() -> None:
    text = text_formatter("worker-1").format(_record("hi"))
    assert text.endswith(" worker-1 WARNING stunnerd.x: hi")
    assert text_formatter().format(_record("hi")).endswith(" WARNING stunnerd.x: hi")


def test_configure_replaces_the_root_handlers(root_restored: None) -> None:
    out = io.StringIO()
    logging.getLogger().addHandler(logging.NullHandler())
    configure_logging("json", "debug", stream=out)
    assert len(logging.getLogger().handlers) == 1
    # A logger no other test configures: a service's (stunner_cds, ...) may keep the level an
    # earlier test in this process gave it.
    logging.getLogger("test_common_logs.configure").debug("one %d", 1)
    assert json.loads(out.getvalue())["msg"] == "one 1"


@pytest.mark.parametrize(("fmt", "level"), [("xml", "INFO"), ("json", "LOUD")])
def test_an_unknown_format_or_level_is_refused_and_nothing_changes(
    root_restored: None, fmt: str, level: str
) -> None:
    before = logging.getLogger().handlers[:]
    with pytest.raises(ValueError, match="unknown log"):
        configure_logging(fmt, level)
    assert logging.getLogger().handlers == before
