"""Log output of every service: one text format and one JSON schema, set up once in ``__main__``.

Modules log through ``logging.getLogger(__name__)`` and never add handlers; each command's
``__main__`` calls `configure_logging` once, which replaces the root logger's handlers with one
stream handler. Levels per scope come on top from `stunner_common.loglevel` specs.

The JSON schema, one object per line::

    {"ts": 1700000000.123456, "level": "INFO", "logger": "stunnerd.app", "msg": "...",
     "tag": "worker-1", "exc": "Traceback ..."}

``ts`` is UNIX seconds (6 decimals); ``tag`` (which process of a group wrote the line) and
``exc`` (a formatted traceback) appear only when set.

Every line goes through `redact_secrets` first: libraries we do not control log request headers
at DEBUG (the WebSocket handshake's ``Authorization: Bearer ...``) or URLs with passwords, and
no secret may reach a log at any level.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Literal, TextIO, get_args

__all__ = [
    "LOG_FORMATS",
    "TEXT_FORMAT",
    "JsonFormatter",
    "LogFormat",
    "RedactingFilter",
    "configure_logging",
    "redact_secrets",
    "text_formatter",
]

_SECRETS = (
    # "Authorization: Bearer <token>" (or Basic), in a header dump or a repr of headers
    (
        re.compile(r"(?i)(authorization['\"]?\s*[:=,]\s*['\"]?)(bearer|basic)\s+[^\s'\",}]+"),
        r"\1\2 ***",
    ),
    # the password of a URL: redis://user:password@host, turn://user:password@host
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@"), r"\1***@"),
)


def redact_secrets(text: str) -> str:
    """``text`` with bearer tokens and URL passwords replaced by ``***``."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record whose message holds a secret (see `redact_secrets`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_secrets(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, in the schema above."""

    def __init__(self, tag: str | None = None) -> None:
        super().__init__()
        self.tag = tag

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.tag:
            entry["tag"] = self.tag
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, separators=(",", ":"))


def text_formatter(tag: str | None = None) -> logging.Formatter:
    """The text format: time, level, logger, message (the tag, when given, after the time)."""
    if tag:
        return logging.Formatter(
            f"%(asctime)s {tag.replace('%', '%%')} %(levelname)s %(name)s: %(message)s"
        )
    return logging.Formatter(TEXT_FORMAT)


def configure_logging(
    log_format: str = "text",
    level: int | str = logging.INFO,
    *,
    tag: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Send every record to ``stream`` (stderr) in ``log_format``; call once, from ``__main__``.

    Raises ``ValueError`` for an unknown format or level name, before touching any handler.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}: expected one of {LOG_FORMATS}")
    if isinstance(level, str):
        number = logging.getLevelName(level.strip().upper())
        if not isinstance(number, int):
            raise ValueError(f"unknown log level {level!r}")
        level = number
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(tag) if log_format == "json" else text_formatter(tag))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
