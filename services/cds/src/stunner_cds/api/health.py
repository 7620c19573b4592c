"""Liveness, readiness (Redis reachable and in sync) and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from stunner_cds.api.common import Context
from stunner_cds.api.schemas import ErrorBody

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str
    rev: int
    epoch: str
    configs: int
    watchers: int


def _health(ctx: Context, status: str) -> dict[str, Any]:
    return Health(
        status=status,
        rev=ctx.hub.mirror.rev,
        epoch=ctx.hub.mirror.epoch,
        configs=len(ctx.hub.mirror.entries),
        watchers=ctx.hub.watcher_count(),
    ).model_dump()


@router.get("/healthz", summary="Liveness: the process serves requests", response_model=Health)
async def healthz(ctx: Context) -> dict[str, Any]:
    return _health(ctx, "ok")


@router.get(
    "/readyz",
    summary="Readiness: Redis is reachable and the mirror is in sync",
    response_model=Health,
    responses={503: {"model": ErrorBody, "description": "Redis unreachable or not yet loaded."}},
)
async def readyz(ctx: Context) -> Any:
    if not ctx.feed.ready:
        return JSONResponse(
            {"code": 503, "message": "config store (Redis) not reachable or not yet loaded"},
            status_code=503,
        )
    return _health(ctx, "ready")


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(ctx: Context) -> Response:
    m = ctx.metrics
    m.revision.set(ctx.hub.mirror.rev)
    m.configs.set(len(ctx.hub.mirror.entries))
    m.redis_up.set(1 if ctx.feed.ready else 0)
    m.queue_depth.set(max((len(w.frames) for w in ctx.hub.watchers()), default=0))
    m.count_direct_writes()
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
