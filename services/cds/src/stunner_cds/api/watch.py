"""WebSocket watches on the config paths: upstream v1 frames, or ``stunner.cds.v2`` envelopes.

Everything that can be refused is refused before the upgrade and before subscribing (upstream leaks
a subscription when the upgrade fails): bad token 401, foreign Origin 403, ``watch`` not true or
bad ``since`` 400, not yet synchronised 503 — each as a JSON body. Once accepted, a change's frame
is written straight to the connection while the watcher has nothing queued
(``stunner_cds.api.direct``); otherwise a writer task drains the watcher's queue (one watchdog task
bounds every send). A reader task discards what the client sends, noticing the close; keepalive
pings (every ``ping_interval_s``, dropping a client silent for ``ping_interval_s +
ping_timeout_s``) are uvicorn's. A watcher the hub dropped as too slow is closed with code 1013 and
the reason; a v2 watcher whose revisions a store reset made meaningless is closed with 1012 (it
comes back for a full snapshot of the new epoch).

What one client may hold is bounded: at most ``max_watchers_per_client`` open watches per IP
(one more is refused before the upgrade with 429, counted in ``stunner_cds_refusals``), messages
of at most ``ws_max_message_bytes`` (uvicorn closes with 1009), and, since the protocol needs no
message from the client at all, at most ``ws_max_messages_per_s`` of them (a burst of
``ws_message_burst``): a client over it is closed with 1008 (policy violation) and counted in
``stunner_cds_watchers_dropped{reason="message_rate"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlsplit

from fastapi import APIRouter, WebSocket
from starlette.responses import Response
from starlette.websockets import WebSocketDisconnect

from stunner_cds.api.common import CdsContext, check_token, context_of, parse_go_bool
from stunner_cds.api.direct import sink_of
from stunner_cds.store.hub import Mode, Topic, Watcher
from stunner_common.cds import (
    CDS_V2_SUBPROTOCOL,
    EPOCH_HEADER,
    EPOCH_PARAM,
    INITIAL_FRAMES_HEADER,
    RESYNC_HEADER,
    REV_HEADER,
    encode_error,
)
from stunner_common.io.http import ApiError

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1")


def _check_origin(ws: WebSocket) -> None:
    """Like gorilla's default: an Origin header, when present, must name the Host we serve."""
    origin = ws.headers.get("origin")
    if not origin:
        return
    origin_host = urlsplit(origin).netloc.lower()
    host = ws.headers.get("host", "").lower()
    if origin_host != host:
        raise ApiError(403, f"origin {origin!r} does not match host {host!r}")


def _since(ws: WebSocket, mode: Mode) -> int | None:
    raw = ws.query_params.get("since")
    if raw is None or mode is Mode.V1:
        return None
    try:
        since = int(raw)
    except ValueError:
        since = -1
    if since < 0:
        raise ApiError(400, f"Invalid format for parameter since: {raw!r} is not a revision")
    return since


async def _deny(ws: WebSocket, error: ApiError) -> None:
    await ws.send_denial_response(
        Response(
            encode_error(error.code, error.message),
            status_code=error.code,
            media_type="application/json",
            headers=error.headers,
        )
    )


async def _serve(ws: WebSocket, topic: Topic) -> None:
    ctx = context_of(ws)
    try:
        check_token(ws)
        _check_origin(ws)
        if not parse_go_bool("watch", ws.query_params.get("watch")):
            raise ApiError(400, "a WebSocket on this path needs watch=true")
        mode = Mode.V2 if CDS_V2_SUBPROTOCOL in ws.scope.get("subprotocols", ()) else Mode.V1
        since = _since(ws, mode)
        if not ctx.hub.mirror.loaded:
            raise ApiError(503, "not yet synchronised with the config store")
    except ApiError as error:
        await _deny(ws, error)
        return
    client = ws.client.host if ws.client is not None else ""
    cap = ctx.settings.max_watchers_per_client
    if cap and ctx.watchers_by_client[client] >= cap:
        ctx.metrics.refusals.labels("watchers_per_client").inc()
        _log_refusal(client, f"more than {cap} open watches")
        await _deny(ws, ApiError(429, f"too many open watches from this client (limit {cap})"))
        return
    node = ws.query_params.get("node") or None
    epoch = ws.query_params.get(EPOCH_PARAM)
    watcher, delta = ctx.hub.subscribe(topic, mode, since=since, epoch=epoch, node=node)
    ctx.metrics.watchers.labels(mode.value).inc()
    ctx.watchers_by_client[client] += 1
    try:
        headers = [(REV_HEADER.encode(), str(ctx.hub.mirror.rev).encode())]
        if mode is Mode.V2:
            headers.append((RESYNC_HEADER.encode(), b"delta" if delta else b"full"))
            headers.append((EPOCH_HEADER.encode(), ctx.hub.mirror.epoch.encode()))
            headers.append((INITIAL_FRAMES_HEADER.encode(), str(len(watcher.frames)).encode()))
        await ws.accept(
            subprotocol=CDS_V2_SUBPROTOCOL if mode is Mode.V2 else None, headers=headers
        )
        counts, key = ctx.metrics.direct_writes, mode.value

        def written() -> None:
            counts[key] += 1

        watcher.sink = sink_of(ws.scope, written)
        await _pump(ws, ctx, watcher)
    except (WebSocketDisconnect, OSError, RuntimeError) as exc:
        log.debug("watcher of %s went away: %r", topic, exc)
    finally:
        ctx.hub.unsubscribe(watcher)
        ctx.metrics.watchers.labels(mode.value).dec()
        ctx.watchers_by_client[client] -= 1
        if ctx.watchers_by_client[client] <= 0:
            del ctx.watchers_by_client[client]


async def _pump(ws: WebSocket, ctx: CdsContext, watcher: Watcher) -> None:
    """Run the writer and the reader until either ends, then stop the other."""
    async with asyncio.TaskGroup() as tasks:
        writer = tasks.create_task(_write(ws, ctx, watcher), name=f"cds-write {watcher.topic}")
        reader = tasks.create_task(_read(ws, ctx), name=f"cds-read {watcher.topic}")
        watcher.writer = writer
        await asyncio.wait((writer, reader), return_when=asyncio.FIRST_COMPLETED)
        writer.cancel()
        reader.cancel()


async def _read(ws: WebSocket, ctx: CdsContext) -> None:
    """Discard what the client sends, within its message rate; close it with 1008 past it."""
    rate, burst = ctx.settings.ws_max_messages_per_s, float(ctx.settings.ws_message_burst)
    clock = asyncio.get_running_loop().time
    tokens, at = burst, clock()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            if rate <= 0:
                continue
            now = clock()
            tokens, at = min(burst, tokens + (now - at) * rate) - 1.0, now
            if tokens < 0:
                ctx.metrics.watchers_dropped.labels("message_rate").inc()
                client = ws.client.host if ws.client is not None else ""
                _log_refusal(client, f"more than {rate:g} messages/s")
                async with asyncio.timeout(ctx.settings.send_timeout_s):
                    await ws.close(code=1008, reason="too many messages")
                return


_LOGGED: dict[str, float] = {}
LOG_INTERVAL_S = 60.0
LOGGED_CLIENTS_MAX = 4096


def _log_refusal(client: str, why: str) -> None:
    """One line per client and minute, in a bounded table."""
    now = asyncio.get_running_loop().time()
    last = _LOGGED.get(client)
    if last is not None and now - last < LOG_INTERVAL_S:
        return
    if len(_LOGGED) >= LOGGED_CLIENTS_MAX:
        _LOGGED.clear()
    _LOGGED[client] = now
    log.info("refused a watch from %s: %s", client or "?", why)


async def _write(ws: WebSocket, ctx: CdsContext, watcher: Watcher) -> None:
    """Send queued frames in order; ``send_watchdog`` bounds how long one send may take."""
    frames_sent = ctx.metrics.frames_sent.labels(watcher.mode.value)
    superseded = ctx.metrics.frames_superseded.labels(watcher.mode.value)
    counted = 0
    clock = asyncio.get_running_loop().time
    try:
        while True:
            batch = await watcher.next_batch()
            if watcher.superseded > counted:
                superseded.inc(watcher.superseded - counted)
                counted = watcher.superseded
            if watcher.closed_reason is not None:
                if watcher.close_kind:
                    ctx.metrics.watchers_dropped.labels(watcher.close_kind).inc()
                async with asyncio.timeout(ctx.settings.send_timeout_s):
                    await ws.close(code=watcher.close_code, reason=watcher.closed_reason[:120])
                return
            watcher.sending_since = clock()
            for frame in batch:
                await ws.send_text(frame)
            watcher.sending_since = None
            frames_sent.inc(len(batch))
    except (WebSocketDisconnect, RuntimeError, OSError):
        return


async def send_watchdog(ctx: CdsContext) -> None:
    """Cancel the writer of any watcher whose current send has blocked for ``send_timeout_s``.

    One timer for every watcher instead of a timeout per frame: per-frame timers cost more than
    the send itself when one change fans out to a thousand watchers.
    """
    timeout_s = ctx.settings.send_timeout_s
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(timeout_s / 4)
        now = loop.time()
        for watcher in list(ctx.hub.watchers()):
            since = watcher.sending_since
            if since is not None and now - since > timeout_s and watcher.writer is not None:
                log.warning(
                    "dropping a %s watcher of %s: a send blocked for %.1f s",
                    watcher.mode.value,
                    watcher.topic,
                    now - since,
                )
                ctx.metrics.watchers_dropped.labels("send_timeout").inc()
                watcher.sending_since = None
                ctx.hub.unsubscribe(watcher)
                watcher.writer.cancel()


@router.websocket("/configs")
async def watch_all(websocket: WebSocket) -> None:
    await _serve(websocket, Topic())


@router.websocket("/configs/{namespace}")
async def watch_namespace(websocket: WebSocket, namespace: str) -> None:
    await _serve(websocket, Topic(namespace))


@router.websocket("/configs/{namespace}/{name}")
async def watch_config(websocket: WebSocket, namespace: str, name: str) -> None:
    await _serve(websocket, Topic(namespace, name))
