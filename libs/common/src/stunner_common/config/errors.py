"""The one exception tree for bad configs.

Every public entry point of `stunner_common.config` (and the URI and TLS helpers) raises only
these, so callers can catch `ConfigError` at their edge and report a clear message: a config that
cannot be read at all is a `ConfigParseError`, a config that reads but breaks a rule is a
`ConfigValidationError` that names the offending field and value.
"""

from __future__ import annotations

from typing import Any


class ConfigError(Exception):
    """Base of every config error; the message is meant for the user."""


class ConfigParseError(ConfigError):
    """The input is not YAML or JSON, or not a mapping, or cannot be read."""


class ConfigValidationError(ConfigError):
    """A field breaks a rule. `field` is a dotted path such as ``listeners[0].port``."""

    def __init__(self, field: str, value: Any, message: str) -> None:
        self.field = field
        self.value = value
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)
