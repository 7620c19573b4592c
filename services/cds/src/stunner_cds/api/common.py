"""What every route shares: the service context, the token check, Go booleans.

Errors are `stunner_common.io.http.ApiError`, answered by the handlers `app` installs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from stunner_cds.metrics import CdsMetrics
from stunner_cds.settings import CdsSettings
from stunner_cds.store.feed import RedisFeed
from stunner_cds.store.hub import Hub
from stunner_common.bearer import bearer_matches
from stunner_common.io.http import ApiError

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


@dataclass(frozen=True, slots=True)
class CdsContext:
    settings: CdsSettings
    hub: Hub
    feed: RedisFeed
    metrics: CdsMetrics
    watchers_by_client: Counter[str] = field(default_factory=Counter)
    """Open watches per client IP (`max_watchers_per_client`)."""


def parse_go_bool(name: str, value: str | None) -> bool:
    """Go's ``strconv.ParseBool``, as upstream parses ``watch``; absent means false."""
    if value is None:
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ApiError(
        400, f"Invalid format for parameter {name}: {value!r} is not a boolean (use true or false)"
    )


def context_of(conn: HTTPConnection) -> CdsContext:
    ctx: CdsContext = conn.app.state.cds
    return ctx


def check_token(conn: HTTPConnection) -> None:
    """Raise a 401 ``ApiError`` unless the bearer token matches (when one is configured)."""
    token = context_of(conn).settings.token
    if token is None:
        return
    header = conn.headers.get("authorization", "")
    if not bearer_matches(header, token.get_secret_value().encode()):
        raise ApiError(
            401,
            "missing or invalid bearer token" if header else "a bearer token is required",
            {"WWW-Authenticate": 'Bearer realm="stunner-cds"'},
        )


def _context(request: Request) -> CdsContext:
    return context_of(request)


def _authorized(request: Request) -> None:
    check_token(request)


Context = Annotated[CdsContext, Depends(_context)]
Authorized = Depends(_authorized)
