"""What every config model shares: the frozen, case-insensitive base and the rule helpers.

`_Model` folds input keys the way Go's JSON decoder does, ignores unknown keys and turns pydantic's
errors into `ConfigValidationError` (via `config_error_from`) with upstream's wording and the field
path. The small validators (Go integers, endpoint URLs, enum tables) are used by the models in
``model.py``, which re-exports `config_error_from`; this module holds no config schema itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator

from stunner_common.config.errors import ConfigParseError, ConfigValidationError

_GO_INT = re.compile(r"^[+-]?[0-9]{1,19}$")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_REPR = 80


class _RuleError(ValueError):
    """A broken config rule; raised inside validators so pydantic records where it happened."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def config_error_from(exc: ValidationError) -> ConfigValidationError:
    """Turn pydantic's error into ours: the first error, with its field path and value."""
    errors = exc.errors(include_url=False)
    if not errors:  # pragma: no cover - pydantic always reports at least one
        return ConfigValidationError("", None, str(exc))
    err = errors[0]
    loc = tuple(err["loc"])
    path = _loc_path(loc)
    value = err.get("input")
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, _RuleError):
        message = cause.message
    elif err["type"] == "missing" and loc and loc[-1] == "name":
        kind = "cluster" if "clusters" in loc or exc.title == "ClusterConfig" else "listener"
        message = f"missing name in {kind} configuration"
        value = None
    elif err["type"] == "missing":
        message = "missing required field"
        value = None
    else:
        message = f"{err['msg']} (got {_short(value)})"
    return ConfigValidationError(path, value, message)


def _go_int(value: Any) -> Any:
    """Ints as Go's decoder takes them, plus decimal strings (env placeholders in int fields)."""
    if isinstance(value, bool):
        raise _RuleError(f"expected an integer, got {_short(value)}")
    if isinstance(value, str) and _GO_INT.match(value.strip()):
        value = int(value.strip())
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _RuleError(f"integer out of range: {_short(value)}")
        return value
    raise _RuleError(f"expected an integer, got {_short(value)}")


GoInt = Annotated[int, BeforeValidator(_go_int)]


def _check_url(value: str, what: str) -> str:
    if value == "":
        return value
    problem = ""
    if _CONTROL.search(value):
        problem = "invalid control character in URL"
    elif _BAD_ESCAPE.search(value):
        problem = "invalid URL escape"
    else:
        try:
            parts = urlsplit(value)
            _ = parts.port
        except ValueError as exc:
            problem = str(exc)
        else:
            if parts.scheme.lower() not in ("http", "https"):
                problem = "the scheme must be http://"
    if problem:
        raise _RuleError(f"invalid {what} endpoint URL {value}: {problem}")
    return value


def _enum(value: Any, table: Mapping[str, str], message: str, *, fold: str = "upper") -> str:
    if not isinstance(value, str):
        raise _RuleError(f'{message}: "{_short(value)}"')
    key = value.upper() if fold == "upper" else value.lower() if fold == "lower" else value
    found = table.get(key)
    if found is None:
        raise _RuleError(f'{message}: "{value}"')
    return found


@functools.cache
def _folded_names(cls: type[BaseModel]) -> dict[str, str]:
    return {name.casefold(): name for name in cls.model_fields}


class _Model(BaseModel):
    """Frozen, case-insensitive on input keys, unknown keys ignored, errors mapped to ours."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=False)

    @model_validator(mode="before")
    @classmethod
    def _fold_keys(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        fields = cls.model_fields
        folded = _folded_names(cls)
        out: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                continue
            name = key if key in fields else folded.get(key.casefold())
            if name is None:
                continue
            if value is None:
                out.pop(name, None)
            else:
                out[name] = value
        return out

    if not TYPE_CHECKING:

        def __init__(self, /, **data: Any) -> None:
            try:
                super().__init__(**data)
            except ValidationError as exc:
                raise config_error_from(exc) from None

        # Tell pydantic this wrapper behaves like BaseModel.__init__, so nested models are
        # still validated inside pydantic-core (keeping the full error path) instead of
        # through this Python-level wrapper.
        __init__.__pydantic_base_init__ = True

        @classmethod
        def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().model_validate(obj, *args, **kwargs)
            except ValidationError as exc:
                raise config_error_from(exc) from None

        @classmethod
        def model_validate_json(cls, data: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().model_validate_json(data, *args, **kwargs)
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                if first["type"] == "json_invalid":
                    raise ConfigParseError(f"config is not JSON: {first['msg']}") from None
                raise config_error_from(exc) from None

        def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False):
            """A copy; with `update`, the result is validated and normalised again."""
            if not update:
                return super().model_copy(deep=deep)
            values = {name: getattr(self, name) for name in type(self).model_fields}
            values.update(update)
            return type(self).model_validate(values)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data with the upstream field names."""
        return self.model_dump(mode="json")
