"""The upstream config paths as plain GETs (``watch=true`` needs a WebSocket: see ``watch``).

Bodies are exactly what upstream's Go server writes (``json.Encoder``: Go field order, trailing
newline), served from the in-memory mirror so that a CDS keeps answering while Redis is away.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.responses import Response

from stunner_cds.api.common import Authorized, Context, parse_go_bool
from stunner_cds.api.schemas import ConfigListBody, ErrorBody
from stunner_cds.store.hub import Topic, fill_for_node
from stunner_common.cds import encode_config_list, encode_v1_config
from stunner_common.io.http import ApiError

router = APIRouter(prefix="/api/v1", tags=["configs"], dependencies=[Authorized])

WATCH_HELP = (
    "`true` upgrades to a WebSocket watch (a plain GET with it gets 400). Upstream v1: one text "
    "frame per full config, a snapshot on connect, the zero config on delete. Offer the "
    "subprotocol `stunner.cds.v2` for JSON envelopes `{type: snapshot|patch|delete, id, rev, "
    "config|patch}` with RFC 6902 patches, and resume with `since=REV`."
)
WatchParam = Annotated[str | None, Query(description=WATCH_HELP)]
SinceParam = Annotated[
    str | None, Query(description="v2 watch only: resume after this revision (ignored here).")
]

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Bad query parameter, or watch without WebSocket."},
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token (when required)."},
    503: {"model": ErrorBody, "description": "Not yet synchronised with Redis."},
}
_LISTING: dict[str, Any] = {
    "responses": {200: {"model": ConfigListBody}, **_ERRORS},
    "response_class": Response,
}
_CONFIG_SCHEMA: dict[str, Any] = {
    "description": "A stunnerd config (v1), as upstream's Go server encodes it.",
    "content": {"application/json": {"schema": {"type": "object"}}},
}


def _plain_get(ctx: Context, watch: str | None) -> None:
    if parse_go_bool("watch", watch):
        raise ApiError(400, "watch=true requires a WebSocket upgrade (GET with Upgrade: websocket)")
    if not ctx.hub.mirror.loaded:
        raise ApiError(503, "not yet synchronised with the config store")


def _list(ctx: Context, topic: Topic) -> Response:
    body = encode_config_list([e.config for _, e in ctx.hub.matching(topic)])
    return Response(body, media_type="application/json")


@router.get("/configs", summary="List every config", **_LISTING)
async def list_configs(
    ctx: Context, watch: WatchParam = None, since: SinceParam = None
) -> Response:
    _plain_get(ctx, watch)
    return _list(ctx, Topic())


@router.get("/configs/{namespace}", summary="List the configs of one namespace", **_LISTING)
async def list_namespace_configs(
    ctx: Context, namespace: str, watch: WatchParam = None, since: SinceParam = None
) -> Response:
    _plain_get(ctx, watch)
    return _list(ctx, Topic(namespace))


@router.get(
    "/configs/{namespace}/{name}",
    summary="Get the config of one Gateway",
    responses={
        200: _CONFIG_SCHEMA,
        404: {"model": ErrorBody, "description": "No config with this id."},
        **_ERRORS,
    },
    response_class=Response,
)
async def get_config(
    ctx: Context,
    namespace: str,
    name: str,
    watch: WatchParam = None,
    since: SinceParam = None,
    node: Annotated[
        str | None,
        Query(description="Node name: rewrites the node-address placeholder of listeners."),
    ] = None,
) -> Response:
    _plain_get(ctx, watch)
    config_id = f"{namespace}/{name}"
    entry = ctx.hub.mirror.entries.get(config_id)
    if entry is None:
        raise ApiError(404, f"Config not found for ID {config_id}")
    body = encode_v1_config(fill_for_node(entry.config, node)) + "\n"
    return Response(body, media_type="application/json")


LICENSE_STATUS = (
    '{"enabledFeatures":[],"subscriptionType":"free","lastUpdated":"N/A","lastError":""}\n'
)
_LICENSE_SCHEMA: dict[str, Any] = {
    "description": "Upstream's LicenseStatus; this build has no licensed features.",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "enabledFeatures": {"type": "array", "items": {"type": "string"}},
                    "subscriptionType": {"type": "string"},
                    "lastUpdated": {"type": "string"},
                    "lastError": {"type": "string"},
                },
            }
        }
    },
}


@router.get(
    "/license",
    summary="License status (for stunnerctl license)",
    responses={200: _LICENSE_SCHEMA, 401: _ERRORS[401]},
    response_class=Response,
)
async def license_status() -> Response:
    return Response(LICENSE_STATUS, media_type="application/json")
