"""What every config model shares: the frozen, slotted, case-insensitive base and the rule helpers.

The config models are plain Python, not pydantic, because every stunnerd process (and each of its
worker processes) holds them: pydantic's machinery would be most of an idle dataplane's memory
(docs/scale.md, "Footprint"). They keep the conventions of the project's pydantic models at the
edges, and the validation rules are written once, here and in ``model.py``.

`_Model` reads input the way Go's JSON decoder does: keys fold case-insensitively, unknown keys and
non-string keys are ignored, a ``null`` value means "the default". Each model declares its fields
as a tuple of `Field`s in declaration order; a field's check turns the input value into the
stored one or raises. Validation stops at the first broken rule, in field order (upstream's order
of checks), and raises `ConfigValidationError` with the field path, the offending input and
upstream's wording. A value of the wrong JSON type gets a message in the style of the project's
other validation errors: ``listeners[0].routes[1]: Input should be a valid string (got 3)``.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import FrozenInstanceError, dataclass, replace
from typing import Any, ClassVar, Final, NoReturn, Self, dataclass_transform
from urllib.parse import urlsplit

from stunner_common.config.errors import ConfigParseError, ConfigValidationError

_GO_INT = re.compile(r"^[+-]?[0-9]{1,19}$")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_REPR = 80
_SEQUENCES: Final = (list, tuple, set, frozenset, deque)

Loc = tuple[int | str, ...]
Check = Callable[[Any, Mapping[str, Any]], Any]
"""A field's check: (the input value, the fields validated before it) -> the stored value."""


class _RuleError(ValueError):
    """A broken config rule, raised by a check; the field it broke is added by the model."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Invalid(Exception):
    """The first problem found, with its location below the model that raises it."""

    def __init__(self, loc: Loc, value: Any, message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.value = value
        self.message = message

    def below(self, *outer: int | str) -> _Invalid:
        self.loc = (*outer, *self.loc)
        return self

    def error(self) -> ConfigValidationError:
        return ConfigValidationError(_loc_path(self.loc), self.value, self.message)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _loc_path(loc: Loc) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _wrong_type(expected: str, value: Any, *loc: int | str) -> NoReturn:
    raise _Invalid(loc, value, f"Input should be a valid {expected} (got {_short(value)})")


# --- checks of JSON types ------------------------------------------------------------------------


def strict_str(value: Any, data: Mapping[str, Any] | None = None) -> str:
    """A string, nothing converted into one."""
    if not isinstance(value, str):
        _wrong_type("string", value)
    return value


def str_tuple(value: Any, data: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """A JSON array (or any Python list, tuple or set) of strings, as a tuple."""
    if not isinstance(value, _SEQUENCES):
        _wrong_type("tuple", value)
    for index, item in enumerate(value):
        if not isinstance(item, str):
            _wrong_type("string", item, index)
    return tuple(value)


def str_dict(value: Any, data: Mapping[str, Any] | None = None) -> dict[str, str]:
    """A JSON object of strings, as a new dict."""
    if not isinstance(value, Mapping):
        _wrong_type("dictionary", value)
    for key, item in value.items():
        if not isinstance(key, str):
            _wrong_type("string", key, key, "[key]")
        if not isinstance(item, str):
            _wrong_type("string", item, key)
    return dict(value)


def go_int(value: Any, data: Mapping[str, Any] | None = None) -> int:
    """Ints as Go's decoder takes them (int64), plus decimal strings (env placeholders in int
    fields); never a bool or a float."""
    if isinstance(value, bool):
        raise _RuleError(f"expected an integer, got {_short(value)}")
    if isinstance(value, str) and _GO_INT.match(value.strip()):
        value = int(value.strip())
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _RuleError(f"integer out of range: {_short(value)}")
        return int(value)
    raise _RuleError(f"expected an integer, got {_short(value)}")


# --- rule helpers --------------------------------------------------------------------------------


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


# --- the model base ------------------------------------------------------------------------------

_REQUIRED: Final = object()


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a model: its check, and its default (absent: required). A default is
    stored as it is unless `validate_default`, when it goes through the check too."""

    name: str
    check: Check
    default: Any = _REQUIRED
    default_factory: Callable[[], Any] | None = None
    validate_default: bool = False
    missing: str = "missing required field"
    """The message when a required field is absent."""

    def absent(self) -> Any:
        if self.default_factory is not None:
            return self.default_factory()
        if self.default is _REQUIRED:
            raise _Invalid((self.name,), None, self.missing)
        return self.default


def field(
    check: Check,
    *,
    default: Any = _REQUIRED,
    default_factory: Callable[[], Any] | None = None,
    validate_default: bool = False,
    missing: str = "missing required field",
) -> Any:
    """Declare a model field: ``port: int = field(_port, DEFAULT_PORT)``."""
    return Field("", check, default, default_factory, validate_default, missing)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(field,))
class _ModelType(type):
    """Collects a model's `field`s, in declaration order, into ``fields`` and ``__slots__``."""

    fields: tuple[Field, ...]
    _names: tuple[str, ...]
    _by_name: dict[str, Field]
    _folded: dict[str, str]

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _ModelType:
        declared = [
            replace(value, name=key) for key, value in namespace.items() if isinstance(value, Field)
        ]
        for f in declared:
            del namespace[f.name]
        namespace.setdefault("__slots__", tuple(f.name for f in declared))
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        inherited = getattr(cls, "fields", ())
        cls.fields = (*inherited, *declared)
        cls._names = tuple(f.name for f in cls.fields)
        cls._by_name = {f.name: f for f in cls.fields}
        cls._folded = {f.name.casefold(): f.name for f in cls.fields}
        return cls


class _Model(metaclass=_ModelType):
    """Frozen, slotted, case-insensitive on input keys, unknown keys ignored, first error raised
    as `ConfigValidationError` with its path.

    A subclass declares each attribute with `field`; equal field values make equal (and equally
    hashed) models.
    """

    __slots__ = ()
    fields: ClassVar[tuple[Field, ...]]
    _names: ClassVar[tuple[str, ...]]
    _by_name: ClassVar[dict[str, Field]]
    _folded: ClassVar[dict[str, str]]

    def __init__(self, /, **data: Any) -> None:
        try:
            values = self._check_all(data)
        except _Invalid as exc:
            raise exc.error() from None
        for name, value in values.items():
            object.__setattr__(self, name, value)

    # --- validation ---

    @classmethod
    def _prepare(cls, data: Mapping[Any, Any]) -> dict[str, Any]:
        """The input's known fields under their own names; ``null`` values dropped."""
        out: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                continue
            name = key if key in cls._by_name else cls._folded.get(key.casefold())
            if name is None:
                continue
            if value is None:
                out.pop(name, None)
            else:
                out[name] = value
        return out

    @classmethod
    def _check_all(cls, data: Mapping[Any, Any]) -> dict[str, Any]:
        given = cls._prepare(data)
        values: dict[str, Any] = {}
        for f in cls.fields:
            if f.name in given:
                raw = given[f.name]
            else:
                raw = f.absent()
                if not f.validate_default:
                    values[f.name] = raw
                    continue
            try:
                values[f.name] = f.check(raw, values)
            except _RuleError as exc:
                raise _Invalid((f.name,), raw, exc.message) from None
            except _Invalid as exc:
                raise exc.below(f.name) from None
        return values

    @classmethod
    def _from(cls, values: Mapping[str, Any]) -> Self:
        obj = cls.__new__(cls)
        for name, value in values.items():
            object.__setattr__(obj, name, value)
        return obj

    @classmethod
    def check(cls, value: Any, data: Mapping[str, Any] | None = None) -> Self:
        """The check of a field holding this model: an instance as it is, a mapping validated."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            _wrong_type(f"dictionary or instance of {cls.__name__}", value)
        return cls._from(cls._check_all(value))

    @classmethod
    def tuple_of(cls, value: Any, data: Mapping[str, Any] | None = None) -> tuple[Self, ...]:
        """The check of a field holding an array of this model."""
        if not isinstance(value, _SEQUENCES):
            _wrong_type("tuple", value)
        items = []
        for index, item in enumerate(value):
            try:
                items.append(cls.check(item))
            except _Invalid as exc:
                raise exc.below(index) from None
        return tuple(items)

    @classmethod
    def model_validate(cls, obj: Any) -> Self:
        """The validated model of `obj` (a mapping, or already an instance)."""
        try:
            return cls.check(obj)
        except _Invalid as exc:
            raise exc.error() from None

    @classmethod
    def model_validate_json(cls, data: str | bytes | bytearray) -> Self:
        """The validated model of a JSON text; text that is not JSON is a `ConfigParseError`."""
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ConfigParseError(f"config is not JSON: {exc}") from None
        return cls.model_validate(obj)

    @classmethod
    def model_construct(cls, **values: Any) -> Self:
        """A model of trusted `values`, defaults for the rest, nothing checked (tests only)."""
        return cls._from(
            {f.name: values[f.name] if f.name in values else f.absent() for f in cls.fields}
        )

    # --- copies and output ---

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Self:
        """A copy; with `update`, the result is validated and normalised again."""
        if not update:
            return self._from(self._values())
        return self.model_validate({**self._values(), **update})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data with the upstream field names, in declaration order."""
        return {name: _plain(getattr(self, name)) for name in self._names}

    # --- a frozen value ---

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"{type(self).__name__} is frozen: use model_copy(update=...)")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"{type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._names)

    def __hash__(self) -> int:
        return hash((type(self).__name__, *(getattr(self, n) for n in self._names)))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._names)
        return f"{type(self).__name__}({inner})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._values()))


def _rebuild(cls: type[_Model], values: Mapping[str, Any]) -> _Model:
    return cls._from(values)


def _plain(value: Any) -> Any:
    # A model's tuples hold either strings or models, never both; dicts hold strings.
    if isinstance(value, _Model):
        return value.to_dict()
    if isinstance(value, tuple):
        if value and isinstance(value[0], _Model):
            return [item.to_dict() for item in value]
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value
