"""The pydantic-settings base of the operator, the CDS, the auth service and turncat/stunnerctl.

Apart from `stunner_common.cli` so that a command line that does not read its settings with
pydantic never loads it: stunnerd reads its own into frozen dataclasses (`stunnerd.settings`),
with the same conventions (the env prefix, flags over the environment, one-line errors that name
the setting, ``environ`` and ``read_from``), and the dataplane's idle memory stays without
pydantic's machinery (docs/scale.md, section 3).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol, Self, TypeVar

from pydantic import PrivateAttr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from stunner_common.logs import configure_logging

__all__ = ["LoggingSettings", "ProcessSettings", "settings_from_args", "validation_message"]


class ProcessSettings(BaseSettings):
    """The settings style of the operator, the CDS, the auth service and turncat (stunnerd follows
    the same conventions without pydantic: `stunnerd.settings`).

    A subclass sets its ``env_prefix`` (``OPERATOR_``, ``CDS_``, ``AUTH_``, ``TURNCAT_``) and is
    built once, where the process starts: from the environment, with the flags over it
    (`settings_from_args`; a subclass that takes flags sets ``populate_by_name``, so that a flag
    is given by its field's name beside an aliased variable), frozen afterwards. ``environ``
    keeps the environment as it was read then, for what is looked up by name further down (a
    kubeconfig through ``KUBECONFIG`` and ``HOME``, the CDS through ``CDS_SERVER_ADDR``, a
    credential plugin's own environment): below the settings module nothing reads
    ``os.environ``. Settings read from another mapping than the process environment (a test)
    say so with `read_from`.
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

    A bad value is reported on stderr as one line, ``<prog>: invalid settings: ...``, and None
    is returned: the caller exits with the usage status (2) without a traceback.
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
