"""The CDS client against a small WebSocket server that drops, restarts and sends deletes.

The server here speaks both formats: upstream's full-config text frames, and `stunner.cds.v2`
envelopes with `since` resume (answering `x-stunner-resync: delta` when it honours it). The real
CDS is exercised in test_dataplane_cds_real.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from stunner_common.backoff import Backoff
from stunner_common.cds import (
    CDS_V2_SUBPROTOCOL,
    RESYNC_HEADER,
    encode_delete,
    encode_patch,
    encode_snapshot,
    encode_v1_delete,
)
from stunnerd.origin.base import ConfigEvent, ConfigOriginError
from stunnerd.origin.cds import CdsOptions, CdsOrigin
from support.stunnerd_process import WATCH_ID, watch_config

pytestmark = pytest.mark.integration

STEP_TIMEOUT_S = 5.0
GATEWAY = CdsOptions("stunner", "udp-gateway")
FAST = Backoff(initial_s=0.02, cap_s=0.1)


class SmallCds:
    """A WebSocket server with a scripted greeting, recording each client's request."""

    def __init__(self, *, v2: bool, greeting: list[str], port: int = 0) -> None:
        self.v2 = v2
        self.greeting = greeting
        self.port = port
        self.honour_since = True
        self.requests: list[dict[str, list[str]]] = []
        self.connections: set[ServerConnection] = set()
        self.connected: asyncio.Queue[ServerConnection] = asyncio.Queue()
        self._server: Server | None = None

    async def start(self) -> None:
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            self.port,
            subprotocols=[Subprotocol(CDS_V2_SUBPROTOCOL)] if self.v2 else None,
            process_response=self._process_response,
        )
        self.port = self._server.sockets[0].getsockname()[1] if self.port == 0 else self.port

    def _process_response(
        self, conn: ServerConnection, request: Request, response: Response
    ) -> Response:
        query = parse_qs(urlsplit(request.path).query)
        self.requests.append(query)
        if self.v2 and "since" in query and self.honour_since:
            response.headers[RESYNC_HEADER] = "delta"
        return response

    async def _handle(self, conn: ServerConnection) -> None:
        self.connections.add(conn)
        try:
            query = self.requests[-1]
            if not (self.v2 and "since" in query and self.honour_since):
                for frame in self.greeting:
                    await conn.send(frame)
            await self.connected.put(conn)
            await conn.wait_closed()
        finally:
            self.connections.discard(conn)

    async def next_connection(self) -> ServerConnection:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            return await self.connected.get()

    async def push(self, frame: str) -> None:
        for conn in list(self.connections):
            await conn.send(frame)

    async def drop_clients(self) -> None:
        for conn in list(self.connections):
            await conn.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


class Follower:
    def __init__(self, origin: CdsOrigin) -> None:
        self.origin = origin
        self.events: asyncio.Queue[ConfigEvent] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(), name="cds-follow")

    async def _run(self) -> None:
        async for event in self.origin.watch():
            await self.events.put(event)

    async def next(self) -> ConfigEvent:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            return await self.events.get()

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@contextlib.asynccontextmanager
async def following(port: int, **options: Any) -> AsyncIterator[Follower]:
    origin = CdsOrigin(
        f"ws://127.0.0.1:{port}",
        dataclasses.replace(GATEWAY, **options),
        env={"STUNNER_ADDR": "127.0.0.5"},
        backoff=FAST,
    )
    follower = Follower(origin)
    try:
        yield follower
    finally:
        await follower.close()


@pytest.fixture
async def v1_server() -> AsyncIterator[SmallCds]:
    server = SmallCds(v2=False, greeting=[json.dumps(watch_config("one"))])
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def v2_server() -> AsyncIterator[SmallCds]:
    server = SmallCds(v2=True, greeting=[encode_snapshot(WATCH_ID, 5, watch_config("one"))])
    await server.start()
    yield server
    await server.stop()


async def test_full_config_frames_are_applied_and_bad_or_delete_frames_skipped(
    no_leaked_tasks: None, v1_server: SmallCds
) -> None:
    async with following(v1_server.port) as f:
        first = await f.next()
        assert first.config.auth.realm == "one"
        assert first.config.listeners[0].address == "127.0.0.5"
        assert first.config.auth.credentials["password"] == "pa$$word"
        assert v1_server.requests[0]["watch"] == ["true"]
        for frame in ("", "not json", json.dumps(watch_config("bad") | {"version": "v9"})):
            await v1_server.push(frame)
        await v1_server.push(encode_v1_delete(WATCH_ID))
        await v1_server.push(json.dumps(watch_config("two")))
        assert (await f.next()).config.auth.realm == "two"
        assert f.origin.connects == 1


async def test_a_dropped_connection_reconnects_and_gets_the_config_again(
    no_leaked_tasks: None, v1_server: SmallCds
) -> None:
    async with following(v1_server.port) as f:
        await f.next()
        await v1_server.next_connection()
        await v1_server.drop_clients()
        again = await f.next()
        assert again.config.auth.realm == "one"
        assert f.origin.connects == 2


async def test_the_watch_rides_out_a_server_restart_on_the_same_port(
    no_leaked_tasks: None, v1_server: SmallCds
) -> None:
    async with following(v1_server.port) as f:
        await f.next()
        await v1_server.stop()
        restarted = SmallCds(
            v2=False, greeting=[json.dumps(watch_config("three"))], port=v1_server.port
        )
        await restarted.start()
        try:
            assert (await f.next()).config.auth.realm == "three"
        finally:
            await restarted.stop()


async def test_a_cds_that_is_down_at_start_is_retried_until_it_comes_up(
    no_leaked_tasks: None, v1_server: SmallCds
) -> None:
    port = v1_server.port
    await v1_server.stop()
    async with following(port) as f:
        late = SmallCds(v2=False, greeting=[json.dumps(watch_config("late"))], port=port)
        for _ in range(500):  # let a few connection attempts fail first
            if f.origin.attempts >= 3:
                break
            await asyncio.sleep(0.01)
        assert f.origin.attempts >= 3
        assert f.origin.connects == 0
        await late.start()
        try:
            assert (await f.next()).config.auth.realm == "late"
        finally:
            await late.stop()


async def test_the_delta_protocol_applies_patches_and_resumes_with_since(
    no_leaked_tasks: None, v2_server: SmallCds
) -> None:
    async with following(v2_server.port) as f:
        snap = await f.next()
        assert (snap.revision, snap.config.auth.realm) == (5, "one")
        await v2_server.push(
            encode_patch(WATCH_ID, 6, [{"op": "replace", "path": "/auth/realm", "value": "six"}])
        )
        patched = await f.next()
        assert (patched.revision, patched.config.auth.realm) == (6, "six")
        await v2_server.next_connection()
        await v2_server.drop_clients()
        await v2_server.next_connection()
        assert v2_server.requests[-1]["since"] == ["6"]
        await v2_server.push(
            encode_patch(
                WATCH_ID, 7, [{"op": "replace", "path": "/listeners/0/port", "value": 4000}]
            )
        )
        resumed = await f.next()
        assert resumed.revision == 7
        assert resumed.config.auth.realm == "six"
        assert resumed.config.listeners[0].port == 4000


async def test_a_patch_that_does_not_apply_forces_a_fresh_snapshot(
    no_leaked_tasks: None, v2_server: SmallCds
) -> None:
    async with following(v2_server.port) as f:
        await f.next()
        await v2_server.next_connection()
        await v2_server.push(
            encode_patch(WATCH_ID, 6, [{"op": "replace", "path": "/no/such/path", "value": 1}])
        )
        await v2_server.next_connection()
        assert "since" not in v2_server.requests[-1]
        fresh = await f.next()
        assert (fresh.revision, fresh.config.auth.realm) == (5, "one")


async def test_a_delete_envelope_keeps_the_last_config_and_a_later_snapshot_applies(
    no_leaked_tasks: None, v2_server: SmallCds
) -> None:
    async with following(v2_server.port) as f:
        await f.next()
        await v2_server.push(encode_delete(WATCH_ID, 8))
        await v2_server.push(encode_snapshot(WATCH_ID, 9, watch_config("nine")))
        event = await f.next()
        assert (event.revision, event.config.auth.realm) == (9, "nine")


async def test_without_the_subprotocol_the_client_falls_back_to_full_frames(
    no_leaked_tasks: None, v1_server: SmallCds
) -> None:
    async with following(v1_server.port) as f:
        event = await f.next()
        assert event.revision is None
        assert event.config.auth.realm == "one"


async def _http_responder(status: int, body: bytes) -> tuple[asyncio.Server, list[bytes]]:
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


async def test_a_one_shot_get_loads_the_config_and_sends_the_node(no_leaked_tasks: None) -> None:
    server, seen = await _http_responder(200, json.dumps(watch_config("get")).encode())
    port = server.sockets[0].getsockname()[1]
    try:
        origin = CdsOrigin(
            f"http://127.0.0.1:{port}", dataclasses.replace(GATEWAY, node="worker-1")
        )
        event = await origin.load()
    finally:
        server.close()
        await server.wait_closed()
    assert event.config.auth.realm == "get"
    assert seen[0].startswith(b"GET /api/v1/configs/stunner/udp-gateway?node=worker-1 HTTP/1.")


async def test_a_one_shot_get_of_a_missing_config_fails_with_the_status(
    no_leaked_tasks: None,
) -> None:
    server, _ = await _http_responder(404, b'{"code":404,"message":"not found"}')
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConfigOriginError, match="404"):
            await CdsOrigin(f"http://127.0.0.1:{port}", CdsOptions("stunner", "missing")).load()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_malformed_envelope_is_skipped_and_the_stream_goes_on(
    no_leaked_tasks: None, v2_server: SmallCds
) -> None:
    async with following(v2_server.port) as f:
        await f.next()
        await v2_server.next_connection()
        for frame in ("not json", '{"type": "bogus", "id": "x", "rev": 1}', "[]"):
            await v2_server.push(frame)
        await v2_server.push(
            encode_patch(WATCH_ID, 6, [{"op": "replace", "path": "/auth/realm", "value": "six"}])
        )
        event = await f.next()
        assert (event.revision, event.config.auth.realm) == (6, "six")
        assert f.origin.connects == 1
