"""Command-line conventions every service's ``__main__`` shares."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from types import MappingProxyType
from typing import Any, Protocol, Self, TypeVar

from pydantic import PrivateAttr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from stunner_common.logs import configure_logging

__all__ = [
    "CDS_ADDR_ENV",
    "DEFAULT_CDS_ADDRESS",
    "DEPRECATED_CDS_ADDR_ENVS",
    "ProcessSettings",
    "add_version_argument",
    "cds_address",
    "check_token_file",
    "distribution_version",
    "listen_problem",
    "settings_from_args",
    "validation_message",
]


class ProcessSettings(BaseSettings):
    """The one settings style of every process: stunnerd, the operator, the CDS, the auth service
    and turncat.

    A subclass sets its ``env_prefix`` (``STUNNERD_``, ``OPERATOR_``, ``CDS_``, ``AUTH_``,
    ``TURNCAT_``) and is built once, where the process starts: from the environment, with the
    flags over it (`settings_from_args`; a subclass that takes flags sets ``populate_by_name``, so
    that a flag is given by its field's name beside an aliased variable), frozen afterwards.
    ``environ`` keeps the environment as it was read then, for what is looked up by name further
    down (a kubeconfig through ``KUBECONFIG`` and ``HOME``, the CDS through ``CDS_SERVER_ADDR``,
    a credential plugin's own environment, the ``$VAR``s of a stunnerd config): below the
    settings module nothing reads ``os.environ``. Settings read from another mapping than the
    process environment (stunnerd's `load_settings` takes a mapping; a test) say so with
    `read_from`.
    """

    model_config = SettingsConfigDict(frozen=True)

    _environ: dict[str, str] = PrivateAttr(default_factory=lambda: dict(os.environ))

    @property
    def environ(self) -> Mapping[str, str]:
        """The process environment when these settings were read (read-only)."""
        return MappingProxyType(self._environ)

    def read_from(self, env: Mapping[str, str]) -> Self:
        """A copy of these settings whose ``environ`` is ``env``, the mapping they were read
        from."""
        copy = self.model_copy()
        copy._environ = dict(env)
        return copy


class LoggingSettings(Protocol):
    """What :func:`settings_from_args` needs of a service's settings to set up its logging."""

    @property
    def log_format(self) -> Any: ...

    @property
    def log_level(self) -> Any: ...


S = TypeVar("S", bound=LoggingSettings)

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
        f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: "
        f"{str(err['msg']).removeprefix('Value error, ')}"
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
