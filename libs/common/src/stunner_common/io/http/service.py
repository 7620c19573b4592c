"""What the CDS and the auth service share as HTTP services: settings, app, server, entry point.

Each service declares its own settings (a subclass of `HttpServiceSettings` with its env prefix
and default port), routes and lifespan; `create_service_app` builds the FastAPI app with the
shared error model, `uvicorn_server` runs it with our logging and bounded shutdown, and `serve`
is the end of each ``__main__``: refuse a port that is taken with one line, then serve until
interrupted.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import uvicorn
from fastapi import APIRouter, FastAPI
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stunner_common.cli import listen_problem
from stunner_common.io.http.errors import GO_STYLE, ErrorStyle, install_error_handlers
from stunner_common.io.http.limits import RequestLimits
from stunner_common.logs import LogFormat
from stunner_common.process_settings import ProcessSettings
from stunner_common.runtime import run as run_loop

__all__ = [
    "HttpServiceSettings",
    "create_service_app",
    "listen_port",
    "serve",
    "uvicorn_server",
]

S = TypeVar("S", bound="HttpServiceSettings")


def listen_port(default: int) -> Any:
    """The ``port`` field of a service's settings (0 picks a free port)."""
    return Field(default, ge=0, le=65535)


class HttpServiceSettings(ProcessSettings):
    """Where an HTTP service listens, how long its shutdown may drain, how it logs.

    Subclasses set ``env_prefix`` in their ``model_config`` and declare ``port`` with their
    default (`listen_port`).
    """

    model_config = SettingsConfigDict(populate_by_name=True)

    host: str = "0.0.0.0"
    port: int = listen_port(0)
    shutdown_timeout_s: float = Field(5.0, gt=0)
    log_level: str = "INFO"
    log_format: LogFormat = "text"
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Request line and headers together; a longer head is answered 431 and closed.",
    )
    max_query_bytes: int = Field(
        2048,
        ge=64,
        description="Query string of a request (the rest of the URI counts in the head);"
        " a longer one is answered 414 and closed.",
    )
    max_body_bytes: int = Field(
        64 * 1024, ge=0, description="Request body; the API takes none (413, closed)."
    )
    request_head_timeout_s: float = Field(
        10.0, gt=0, description="Time a client has to send a complete request head (408)."
    )

    def request_limits(self, max_connections_per_client: int) -> RequestLimits:
        """The limits uvicorn's parser enforces (`stunner_common.io.http.limits`), with the
        service's own cap on connections per client IP."""
        return RequestLimits(
            max_header_bytes=self.max_header_bytes,
            max_query_bytes=self.max_query_bytes,
            max_body_bytes=self.max_body_bytes,
            request_head_timeout_s=self.request_head_timeout_s,
            max_connections_per_client=max_connections_per_client,
        )


def create_service_app(
    *,
    title: str,
    version: str,
    description: str | None,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]],
    routers: Iterable[APIRouter] = (),
    errors: ErrorStyle = GO_STYLE,
) -> FastAPI:
    """A FastAPI app with ``routers``, ``lifespan`` and JSON errors in the ``errors`` style."""
    app = FastAPI(title=title, version=version, description=description or "", lifespan=lifespan)
    for router in routers:
        app.include_router(router)
    install_error_handlers(app, errors)
    return app


def uvicorn_server(app: FastAPI, settings: HttpServiceSettings, **options: Any) -> uvicorn.Server:
    """A uvicorn server for ``app`` on the settings' host and port (``port=0`` picks a free
    one): our logging (no uvicorn config, no access log) and a bounded graceful shutdown;
    ``options`` add to or replace uvicorn's."""
    config: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "lifespan": "on",
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": int(max(1, settings.shutdown_timeout_s)),
    }
    return uvicorn.Server(uvicorn.Config(app, **(config | options)))


def serve(prog: str, settings: S, build: Callable[[S], uvicorn.Server]) -> int:
    """Serve until interrupted; the exit status of a service's ``main``.

    A port that is taken or an address not on this host is one line on stderr and status 1,
    before the app starts (its lifespan's clients would report their own errors first).
    """
    if (problem := listen_problem(settings.host, settings.port)) is not None:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 1
    server = build(settings)
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(server.serve())
    return 0
