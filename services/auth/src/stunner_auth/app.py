"""The auth service's HTTP API: upstream stunner-auth-service's two endpoints, plus health.

``GET /?service=turn`` answers a TURN REST API stanza and ``GET /ice?service=turn`` an
RTCConfiguration, both filtered by ``namespace``, ``gateway``, ``listener`` and shaped by
``username``, ``ttl`` and ``iceTransportPolicy``. Errors are ``{"code": N, "message": ...}``.
Unlike upstream, whose API is unauthenticated, a bearer token can be required (``AUTH_TOKEN``);
``/healthz``, ``/readyz`` and ``/metrics`` stay open for probes and scrapers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from stunner_auth import __version__
from stunner_auth.feed import ConfigFeed
from stunner_auth.ice import IcePolicy, IceQuery, NoMatchError, ice_config, turn_rest_answer
from stunner_auth.metrics import AuthMetrics
from stunner_auth.settings import AuthSettings
from stunner_common.bearer import bearer_matches
from stunner_common.io.cds import TokenSource
from stunner_common.io.http import ApiError, ErrorStyle, create_service_app

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

ERRORS = ErrorStyle(newline=False, full_location=False)
"""How this service has always worded its errors (no trailing newline, a parameter's name)."""


def _feed(request: Request) -> ConfigFeed:
    feed: ConfigFeed = request.app.state.feed
    return feed


def _settings(request: Request) -> AuthSettings:
    settings: AuthSettings = request.app.state.settings
    return settings


Feed = Annotated[ConfigFeed, Depends(_feed)]
Settings = Annotated[AuthSettings, Depends(_settings)]


def _query(
    settings: Settings,
    service: Annotated[str | None, Query(description="Must be `turn`.")] = None,
    namespace: Annotated[str | None, Query(description="Only Gateways in this namespace.")] = None,
    gateway: Annotated[str | None, Query(description="Only this Gateway.")] = None,
    listener: Annotated[str | None, Query(description="Only this listener.")] = None,
    username: Annotated[
        str | None, Query(description="User id put in ephemeral usernames (`expiry:username`).")
    ] = None,
    ttl: Annotated[int | None, Query(description="Lifetime of ephemeral credentials, s.")] = None,
    ice_transport_policy: Annotated[
        str, Query(alias="iceTransportPolicy", description="`all` (default) or `relay`.")
    ] = "all",
) -> IceQuery:
    if service != "turn":
        raise ApiError(400, f"service must be 'turn' (got {service!r})")
    ttl_s = settings.default_ttl_s if ttl is None else ttl
    if not 0 < ttl_s <= settings.max_ttl_s:
        raise ApiError(400, f"ttl must be between 1 and {settings.max_ttl_s} seconds (got {ttl_s})")
    if ice_transport_policy not in ("all", "relay"):
        raise ApiError(
            400, f"iceTransportPolicy must be 'all' or 'relay' (got {ice_transport_policy!r})"
        )
    policy: IcePolicy = "relay" if ice_transport_policy == "relay" else "all"
    if username is not None and not username:
        raise ApiError(400, "username must not be empty")
    return IceQuery(namespace, gateway, listener, username, ttl_s, policy, ttl is not None)


Filters = Annotated[IceQuery, Depends(_query)]


def _answer(feed: ConfigFeed, build: Callable[[], dict[str, object]]) -> dict[str, object]:
    if not feed.ready:
        raise ApiError(503, "no configs yet: the config discovery service has not answered")
    try:
        return build()
    except NoMatchError as exc:
        raise ApiError(404, str(exc)) from exc


router = APIRouter()


@router.get("/", summary="TURN REST API credentials (username, password, ttl, uris)")
async def turn_auth(feed: Feed, query: Filters) -> dict[str, object]:
    return _answer(feed, lambda: turn_rest_answer(feed.configs, query, time.time()))


@router.get("/ice", summary="An RTCConfiguration (iceServers, iceTransportPolicy)")
async def ice(feed: Feed, query: Filters) -> dict[str, object]:
    return _answer(feed, lambda: ice_config(feed.configs, query, time.time()))


@router.get("/healthz", summary="Liveness")
async def healthz(feed: Feed) -> dict[str, Any]:
    return {"status": "ok", "configs": len(feed.configs)}


@router.get("/readyz", summary="Readiness: the CDS has answered and its configs arrived")
async def readyz(feed: Feed) -> Any:
    if not feed.ready:
        return ERRORS.response(503, "config discovery service not reachable yet")
    return {"status": "ready", "configs": len(feed.configs)}


@router.get(
    "/metrics",
    summary="Prometheus metrics: refusals by limit",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _lifespan(
    settings: AuthSettings,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cds_token: str | TokenSource | None = (
            settings.cds_token.get_secret_value() if settings.cds_token else None
        )
        if settings.cds_token_file:
            cds_token = TokenSource(file=settings.cds_token_file)
        feed = ConfigFeed(settings.cds_url, token=cds_token, timeout_s=settings.cds_timeout_s)
        app.state.feed = feed
        app.state.settings = settings
        feed.start()
        try:
            yield
        finally:
            await feed.stop()

    return lifespan


def _require_bearer(app: FastAPI, token: bytes) -> None:
    """Refuse every request but probes and CORS preflights without ``Bearer <token>``."""

    @app.middleware("http")
    async def bearer_token(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path in OPEN_PATHS or request.method == "OPTIONS":
            return await call_next(request)
        if not bearer_matches(request.headers.get("authorization", ""), token):
            log.info("refused a request to %s: missing or wrong bearer token", request.url.path)
            return ERRORS.response(
                401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"}
            )
        return await call_next(request)


def create_app(settings: AuthSettings, metrics: AuthMetrics | None = None) -> FastAPI:
    """The app; ``metrics`` (made here when not given) is ``app.state.metrics``."""
    app = create_service_app(
        title="STUNner authentication service",
        version=__version__,
        description=__doc__,
        lifespan=_lifespan(settings),
        routers=[router],
        errors=ERRORS,
    )
    app.state.metrics = metrics or AuthMetrics()
    if settings.token:
        _require_bearer(app, settings.token.get_secret_value().encode())
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET"],
            allow_headers=["Authorization"],
        )
    return app
