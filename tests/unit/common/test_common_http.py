"""The HTTP error model the CDS and the auth service share (stunner_common.io.http).

Each service keeps its own bytes: the CDS ends a body with a newline and names a bad parameter
by its location, as upstream's Go server; the auth service does neither. Driven in-process
through httpx's ASGI transport (no sockets).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Query
from pydantic_settings import SettingsConfigDict

from stunner_common.io.http import (
    ApiError,
    ErrorStyle,
    HttpServiceSettings,
    create_service_app,
    listen_port,
)

router = APIRouter()


@router.get("/teapot")
async def teapot() -> None:
    raise ApiError(418, "I'm a teapot", {"X-Why": "short and stout"})


@router.get("/count")
async def count(n: Annotated[int, Query()]) -> dict[str, int]:
    return {"n": n}


@contextlib.asynccontextmanager
async def nothing(_: FastAPI) -> AsyncIterator[None]:
    yield


async def get(style: ErrorStyle, path: str) -> httpx.Response:
    app = create_service_app(
        title="t", version="0", description=None, lifespan=nothing, routers=[router], errors=style
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get(path)


GO = ErrorStyle()
AUTH = ErrorStyle(newline=False, full_location=False)


@pytest.mark.parametrize(
    ("style", "path", "status", "body"),
    [
        (GO, "/teapot", 418, '{"code":418,"message":"I\'m a teapot"}\n'),
        (AUTH, "/teapot", 418, '{"code":418,"message":"I\'m a teapot"}'),
        (GO, "/nowhere", 404, '{"code":404,"message":"Not Found"}\n'),
        (AUTH, "/nowhere", 404, '{"code":404,"message":"Not Found"}'),
        (
            GO,
            "/count?n=x",
            400,
            '{"code":400,"message":"invalid request: query.n: Input should be a valid integer, '
            'unable to parse string as an integer"}\n',
        ),
        (
            AUTH,
            "/count?n=x",
            400,
            '{"code":400,"message":"invalid request: n: Input should be a valid integer, '
            'unable to parse string as an integer"}',
        ),
    ],
)
async def test_each_style_answers_errors_as_code_and_message_with_the_status(
    style: ErrorStyle, path: str, status: int, body: str
) -> None:
    response = await get(style, path)
    assert (response.status_code, response.text) == (status, body)
    assert response.headers["content-type"] == "application/json"


async def test_an_api_error_keeps_its_headers_and_a_405_names_the_allowed_methods() -> None:
    assert (await get(GO, "/teapot")).headers["x-why"] == "short and stout"
    app = create_service_app(
        title="t", version="0", description=None, lifespan=nothing, routers=[router]
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.post("/count?n=1")
    assert (response.status_code, response.headers["allow"]) == (405, "GET")


class DemoSettings(HttpServiceSettings):
    model_config = SettingsConfigDict(env_prefix="STUNNER_TEST_DEMO_")

    port: int = listen_port(1234)


def test_service_settings_default_to_every_address_and_the_service_port() -> None:
    settings = DemoSettings()
    assert (settings.host, settings.port, settings.log_format) == ("0.0.0.0", 1234, "text")
    with pytest.raises(ValueError, match="port"):
        DemoSettings(port=70000)
