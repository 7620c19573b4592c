"""The JSON error model of our HTTP services: ``{"code": N, "message": "..."}`` with status N.

Routes raise `ApiError`; `install_error_handlers` answers it, Starlette's own HTTP errors (404,
405, ...) and request validation errors (400) in that one shape, so a client never sees FastAPI's
``{"detail": ...}``. The CDS writes its bodies as upstream's Go server does (``json.Encoder``: a
trailing newline) and names a bad parameter by its whole location (``query.since``); the auth
service has always answered without the newline and with the parameter's name alone: an
`ErrorStyle` holds that difference, so both keep their bodies byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

__all__ = ["ApiError", "ErrorStyle", "error_response", "install_error_handlers"]

_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class ApiError(Exception):
    """An error answered as ``{"code": N, "message": ...}`` with HTTP status N."""

    def __init__(self, code: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers


@dataclass(frozen=True, slots=True)
class ErrorStyle:
    """How one service words its errors (see the module docstring)."""

    newline: bool = True
    """End the body with a newline, as Go's ``json.Encoder`` does."""
    full_location: bool = True
    """Name a bad parameter by its location (``query.ttl``) rather than its name (``ttl``)."""

    def body(self, code: int, message: str) -> bytes:
        """The JSON body of an error, as bytes."""
        text = _DUMPS({"code": code, "message": message}) + ("\n" if self.newline else "")
        return text.encode()

    def response(self, code: int, message: str, headers: dict[str, str] | None = None) -> Response:
        body = self.body(code, message)
        return Response(body, status_code=code, media_type="application/json", headers=headers)

    def invalid_request(self, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{self._location(err.get('loc', ()))}: {err.get('msg', '')}" for err in exc.errors()
        )
        return self.response(400, f"invalid request: {problems}")

    def _location(self, loc: tuple[object, ...]) -> str:
        if self.full_location:
            return ".".join(str(part) for part in loc)
        return str(loc[-1]) if loc else ""


GO_STYLE = ErrorStyle()


def error_response(code: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """An error in the default (upstream Go) style."""
    return GO_STYLE.response(code, message, headers)


def install_error_handlers(app: FastAPI, style: ErrorStyle = GO_STYLE) -> None:
    """Answer `ApiError`, Starlette's HTTP errors and validation errors in ``style``."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Response:
        return style.response(exc.code, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers) if exc.headers else None
        return style.response(exc.status_code, str(exc.detail), headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        return style.invalid_request(exc)
