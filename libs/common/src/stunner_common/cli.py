"""Command-line conventions every service's ``__main__`` shares.

Free of pydantic, so that stunnerd's command line does not load it; the pydantic-settings base of
the other services and its flags step are in `stunner_common.process_settings`.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CDS_ADDR_ENV",
    "DEFAULT_CDS_ADDRESS",
    "DEPRECATED_CDS_ADDR_ENVS",
    "HelpFormatter",
    "add_version_argument",
    "cds_address",
    "check_token_file",
    "distribution_version",
    "listen_problem",
]


CDS_ADDR_ENV = "CDS_SERVER_ADDR"
"""The one environment variable for the CDS address (upstream's name), read by every tool."""
DEPRECATED_CDS_ADDR_ENVS = ("STUNNER_CDS_ADDR", "AUTH_CDS_URL")
"""Older names still honoured, with a warning: turncat and stunnerctl's, the auth service's."""
DEFAULT_CDS_ADDRESS = "127.0.0.1:13478"
"""Where `make run` and the compose stack put the CDS; every tool's default."""


def cds_address(env: Mapping[str, str], flag: str | None = None) -> tuple[str, list[str]]:
    """The CDS address a tool uses, and the warnings to print about how it was given.

    The flag wins, then ``CDS_SERVER_ADDR``, then a deprecated name (with a warning), then
    ``DEFAULT_CDS_ADDRESS``. A deprecated name set beside a newer source is ignored, with a
    warning when it says something else.
    """
    warnings: list[str] = []
    chosen = flag.strip() if flag and flag.strip() else None
    source = "the flag" if chosen else ""
    if chosen is None and env.get(CDS_ADDR_ENV, "").strip():
        chosen, source = env[CDS_ADDR_ENV].strip(), CDS_ADDR_ENV
    for old in DEPRECATED_CDS_ADDR_ENVS:
        value = env.get(old, "").strip()
        if not value:
            continue
        if chosen is None:
            chosen = value
            warnings.append(f"{old} is deprecated: set {CDS_ADDR_ENV} instead")
        elif value != chosen:
            warnings.append(f"{old}={value} is ignored: the CDS address comes from {source}")
    return chosen or DEFAULT_CDS_ADDRESS, warnings


def listen_problem(host: str, port: int) -> str | None:
    """Why a server cannot listen on ``host:port`` (the port taken, an address not on this
    host), as one line with the way out; None when it can (port 0 always can).

    Servers check this before they start, so that the answer is this and not whatever fails next
    (their Redis or CDS client starts with the app and would report its own errors first).
    """
    if port == 0:
        return None
    host = host or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (
                    f"port {port} on {host} is already in use (`make stop` stops an earlier "
                    "`make run`); choose another with --port"
                )
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        except (OverflowError, UnicodeError) as exc:
            return f"cannot listen on {host}:{port}: {exc}"
    return None


def check_token_file(path: str | os.PathLike[str] | None) -> str | None:
    """None when ``path`` (a CDS token file) is unset or a readable, non-empty file; else why
    not, as one line naming the file (never its content)."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read(64 * 1024 + 1)
    except OSError as exc:
        return f"CDS token file {os.fspath(path)!r}: {exc.strerror or exc}"
    if not data.strip():
        return f"CDS token file {os.fspath(path)!r} is empty"
    return None


def distribution_version(distribution: str) -> str:
    """The installed version of ``distribution`` (e.g. ``stunnerd``), or ``unknown``."""
    # importlib.metadata (with email, zipfile and csv) is megabytes of a process's memory that
    # only `--version` needs.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, told the terminal's width: left to find it, it imports shutil
    (with bz2 and lzma), which then stays in a daemon's memory for good."""

    def __init__(self, prog: str) -> None:
        try:
            width = os.get_terminal_size().columns
        except OSError:
            width = 80
        super().__init__(prog, width=width - 2)


class _VersionAction(argparse.Action):
    """``--version``, looking the version up only when it is asked for."""

    def __init__(self, option_strings: list[str], dest: str, distribution: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)
        self.distribution = distribution

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"{parser.prog} {distribution_version(self.distribution)}")
        parser.exit()


def add_version_argument(parser: argparse.ArgumentParser, distribution: str) -> None:
    """``--version``: print ``<prog> <version>`` to stdout and exit 0."""
    parser.add_argument(
        "--version",
        action=_VersionAction,
        distribution=distribution,
        help="print the version and exit",
    )
