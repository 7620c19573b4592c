"""Command-line conventions every service's ``__main__`` shares."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from stunner_common.logs import configure_logging

__all__ = [
    "add_version_argument",
    "distribution_version",
    "settings_from_args",
    "validation_message",
]


class LoggingSettings(Protocol):
    """What :func:`settings_from_args` needs of a service's settings to set up its logging."""

    @property
    def log_format(self) -> Any: ...

    @property
    def log_level(self) -> Any: ...


S = TypeVar("S", bound=LoggingSettings)


def distribution_version(distribution: str) -> str:
    """The installed version of ``distribution`` (e.g. ``stunnerd``), or ``unknown``."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


def add_version_argument(parser: argparse.ArgumentParser, distribution: str) -> None:
    """``--version``: print ``<prog> <version>`` to stdout and exit 0."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {distribution_version(distribution)}",
        help="print the version and exit",
    )


def validation_message(exc: ValidationError) -> str:
    """A pydantic error as one line, ``field: problem; ...``, without pydantic's documentation
    links or the rejected input (which may be a secret)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
        for err in exc.errors()
    )


def settings_from_args(
    prog: str,
    build: Callable[..., S],
    args: argparse.Namespace,
    fields: Iterable[str],
) -> S | None:
    """A service's settings from the flags given (``fields`` of ``args`` that are not None) over
    its environment, with logging configured from them.

    A bad value is reported on stderr as one line, ``<prog>: ...``, and None is returned: the
    caller exits with the usage status (2) without a traceback.
    """
    overrides = {name: value for name in fields if (value := getattr(args, name)) is not None}
    try:
        settings = build(**overrides)
    except ValidationError as exc:
        print(f"{prog}: invalid settings: {validation_message(exc)}", file=sys.stderr)
        return None
    try:
        configure_logging(settings.log_format, settings.log_level)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    return settings
