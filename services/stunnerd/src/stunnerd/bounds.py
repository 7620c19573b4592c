"""Bounds of a number setting, as `Annotated` markers: ``Annotated[float, Gt(0)]``,
``Annotated[int, Interval(ge=0, le=65535)]``.

The names are those of the `annotated_types` package, which stunnerd does not load: with what it
imports (datetime, typing_extensions) it would add about 1 MiB to every idle stunnerd process
(docs/scale.md, "Footprint"). `stunnerd.settings` checks the bounds when it reads a setting.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class Bound:
    """One bound: a value must compare with `limit` as the subclass says."""

    limit: float
    compare: ClassVar[Callable[[Any, Any], bool]]
    words: ClassVar[str]

    def problem(self, value: float) -> str | None:
        """None when `value` is within the bound, else what is wrong (never the value)."""
        if type(self).compare(value, self.limit):
            return None
        return f"Input should be {self.words} {self.limit}"


class Gt(Bound):
    __slots__ = ()
    compare = operator.gt
    words = "greater than"


class Ge(Bound):
    __slots__ = ()
    compare = operator.ge
    words = "greater than or equal to"


class Lt(Bound):
    __slots__ = ()
    compare = operator.lt
    words = "less than"


class Le(Bound):
    __slots__ = ()
    compare = operator.le
    words = "less than or equal to"


@dataclass(frozen=True, slots=True)
class Interval:
    """Several bounds at once: ``Interval(ge=0, le=65535)``."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def bounds(self) -> tuple[Bound, ...]:
        pairs = ((Gt, self.gt), (Ge, self.ge), (Lt, self.lt), (Le, self.le))
        return tuple(kind(limit) for kind, limit in pairs if limit is not None)
