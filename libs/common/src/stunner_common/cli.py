"""Command-line conventions every service's ``__main__`` shares."""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError

__all__ = ["add_version_argument", "distribution_version", "validation_message"]


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
