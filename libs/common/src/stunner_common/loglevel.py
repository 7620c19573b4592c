"""Upstream log-level specs (``all:INFO,turn:DEBUG``) mapped onto Python logging.

A spec is a comma-separated list of ``<scope>:<LEVEL>`` applied left to right; malformed entries
are skipped. ``all`` sets the default and clears every scope set before it. Specs are cumulative
across `apply_log_spec` calls, as in stunnerd where a config's ``admin.loglevel`` is applied after
each reconcile. A scope names a logger: registered scopes map to the project's loggers (``turn``
→ ``stunnerd.turn``), any other scope is taken as a logger name. ``all`` sets the project's
top-level loggers, not the root logger, so third-party libraries keep the level ``__main__``
gave them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

__all__ = [
    "ALL_SCOPE",
    "DISABLE",
    "LEVELS",
    "PROJECT_LOGGERS",
    "TRACE",
    "apply_log_spec",
    "parse_log_spec",
    "register_log_scope",
    "reset_log_spec",
]

TRACE = 5
DISABLE = logging.CRITICAL + 10
ALL_SCOPE = "all"
LEVELS: dict[str, int] = {
    "DISABLE": DISABLE,
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": TRACE,
}
PROJECT_LOGGERS: tuple[str, ...] = (
    "stunner_common",
    "stunnerd",
    "stunner_cds",
    "stunner_operator",
    "turncat",
)

logging.addLevelName(TRACE, "TRACE")
logging.addLevelName(DISABLE, "DISABLE")

_lock = threading.Lock()
_scopes: dict[str, tuple[str, ...]] = {
    "stunnerd": ("stunnerd",),
    "stunner": ("stunnerd",),
    "turn": ("stunnerd.turn",),
    "cds": ("stunner_cds",),
    "operator": ("stunner_operator",),
    "turncat": ("turncat",),
    "common": ("stunner_common",),
}
_applied: dict[str, int] = {}


def register_log_scope(scope: str, loggers: Iterable[str]) -> None:
    """Let `scope` in a spec set the level of `loggers` (replacing an earlier registration)."""
    with _lock:
        _scopes[scope] = tuple(loggers)


def parse_log_spec(spec: str) -> dict[str, int]:
    """The levels one spec asks for, scope → logging level, ``all`` included when given."""
    levels: dict[str, int] = {}
    for entry in spec.split(","):
        scope, sep, level_name = entry.strip().partition(":")
        scope, level = scope.strip(), LEVELS.get(level_name.strip().upper())
        if not sep or not scope or level is None:
            continue
        if scope.lower() == ALL_SCOPE:
            levels.clear()
            scope = ALL_SCOPE
        levels[scope] = level
    return levels


def _loggers_for(scope: str) -> tuple[str, ...]:
    if scope == ALL_SCOPE:
        return PROJECT_LOGGERS
    return _scopes.get(scope, (scope,))


def apply_log_spec(spec: str) -> None:
    """Set logger levels from `spec`, on top of what earlier specs set."""
    levels = parse_log_spec(spec)
    with _lock:
        if ALL_SCOPE in levels:
            for scope in list(_applied):
                if scope != ALL_SCOPE:
                    for name in _loggers_for(scope):
                        logging.getLogger(name).setLevel(logging.NOTSET)
                    del _applied[scope]
        for scope, level in levels.items():
            for name in _loggers_for(scope):
                logging.getLogger(name).setLevel(level)
            _applied[scope] = level


def reset_log_spec() -> None:
    """Forget every applied spec and return the touched loggers to NOTSET (inherit)."""
    with _lock:
        for scope in list(_applied):
            for name in _loggers_for(scope):
                logging.getLogger(name).setLevel(logging.NOTSET)
        _applied.clear()
