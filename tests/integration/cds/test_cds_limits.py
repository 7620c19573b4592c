"""Request limits: oversized heads, queries, bodies and frames, and slow heads, refused cheaply.

Each refusal is a JSON ``{"code", "message"}`` body with the right 4xx status and a closed
connection; the server keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from support.cds import FRAME_TIMEOUT_S, RunningCds, http_get, running_cds
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration

LIMITS = {
    "max_header_bytes": 4096,
    "max_query_bytes": 256,
    "max_body_bytes": 1024,
    "ws_max_message_bytes": 2048,
    "request_head_timeout_s": 0.5,
}


@pytest.fixture
async def limited(no_leaked_tasks: None, redis: RedisServer) -> AsyncIterator[RunningCds]:
    async with running_cds(redis.url, **LIMITS) as running:
        yield running


@contextlib.asynccontextmanager
async def raw(cds: RunningCds) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", cds.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def response_of(
    reader: asyncio.StreamReader,
) -> tuple[int, dict[str, str], dict[str, object]]:
    """Read one response up to EOF: the server closes after every refusal."""
    async with asyncio.timeout(FRAME_TIMEOUT_S):
        data = await reader.read(-1)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, json.loads(body)


async def send_quietly(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write, ignoring the reset a server that already refused may answer with."""
    with contextlib.suppress(ConnectionError):
        writer.write(data)
        await writer.drain()


async def drain_until_closed(ws: ClientConnection) -> None:
    async with asyncio.timeout(FRAME_TIMEOUT_S):
        while True:
            await ws.recv()


async def still_serves(cds: RunningCds) -> None:
    assert (await http_get(cds, "/healthz")).status_code == 200


async def test_a_head_over_the_limit_is_a_431_and_the_rest_is_never_read(
    limited: RunningCds,
) -> None:
    async with raw(limited) as (reader, writer):
        answer = asyncio.create_task(response_of(reader))
        await send_quietly(writer, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        sent = 0
        # a header that would be 50 MB: the server must answer long before it ends
        while sent < 50 * 1024 * 1024 and not answer.done():
            await send_quietly(writer, b"X-Filler: " + b"a" * 1000 + b"\r\n")
            sent += 1012
            await asyncio.sleep(0)
        status, headers, body = await answer
    assert status == 431
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert body["code"] == 431
    assert "4096" in str(body["message"])
    assert sent < 2 * 1024 * 1024, "the server kept reading a head far past its limit"
    await still_serves(limited)


async def test_a_long_query_is_a_414_for_get_and_for_a_watch(limited: RunningCds) -> None:
    query = "node=" + "n" * 300
    for extra in ("", "&watch=true"):
        async with raw(limited) as (reader, writer):
            upgrade = (
                "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                if extra
                else ""
            )
            writer.write(
                f"GET /api/v1/configs?{query}{extra} HTTP/1.1\r\nHost: x\r\n{upgrade}\r\n".encode()
            )
            status, _, body = await response_of(reader)
        assert (status, body["code"]) == (414, 414)
    short = await http_get(limited, "/api/v1/configs", params={"node": "n" * 100})
    assert short.status_code == 200


async def test_a_declared_body_over_the_limit_is_a_413_before_it_is_sent(
    limited: RunningCds,
) -> None:
    async with raw(limited) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n")
        status, _, body = await response_of(reader)
    assert (status, body["code"]) == (413, 413)
    await still_serves(limited)


async def test_a_chunked_body_growing_past_the_limit_ends_the_connection(
    limited: RunningCds,
) -> None:
    async with raw(limited) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        sent = 0
        with contextlib.suppress(ConnectionError):
            # up to 4 MB: without a limit the server would read and discard all of it
            while sent < 4 * 1024 * 1024 and not reader.at_eof():
                writer.write(b"400\r\n" + b"z" * 1024 + b"\r\n")
                await writer.drain()
                sent += 1024
                await asyncio.sleep(0)
            async with asyncio.timeout(FRAME_TIMEOUT_S):
                await reader.read(-1)
    assert sent < 1024 * 1024, "the server kept reading a body far past its limit"
    await still_serves(limited)


async def test_a_head_that_never_ends_is_a_408(limited: RunningCds) -> None:
    async with raw(limited) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        status, _, body = await response_of(reader)
    assert (status, body["code"]) == (408, 408)
    assert "0.5 s" in str(body["message"])


async def test_an_idle_connection_that_sends_nothing_is_closed_with_a_408(
    limited: RunningCds,
) -> None:
    async with raw(limited) as (reader, _):
        status, _, _ = await response_of(reader)
    assert status == 408


async def test_garbage_is_a_json_400(limited: RunningCds) -> None:
    async with raw(limited) as (reader, writer):
        writer.write(b"\x16\x03\x01 definitely not http\r\n\r\n")
        status, headers, body = await response_of(reader)
    assert (status, body["code"]) == (400, 400)
    assert headers["content-type"] == "application/json"


async def test_keep_alive_requests_within_the_limits_are_served(limited: RunningCds) -> None:
    async with raw(limited) as (reader, writer):
        for _ in range(3):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 3000 + b"\r\n\r\n")
            async with asyncio.timeout(FRAME_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)


async def test_a_websocket_message_over_the_limit_closes_the_watch_with_1009(
    limited: RunningCds,
) -> None:
    async with connect(f"{limited.ws_url}/api/v1/configs?watch=true") as ws:
        await ws.send("x" * 4096)
        with pytest.raises(ConnectionClosed) as closed:
            await drain_until_closed(ws)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009
    await still_serves(limited)


async def test_each_http_refusal_is_counted_by_its_limit(limited: RunningCds) -> None:
    requests = {
        "header_bytes": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 40960 + b"\r\n\r\n",
        "query_bytes": b"GET /api/v1/configs?node=" + b"n" * 2560 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "body_bytes": b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10240\r\n\r\n",
        "request_head_timeout": b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
    }
    for data in requests.values():
        async with raw(limited) as (reader, writer):
            await send_quietly(writer, data)
            await response_of(reader)
    text = (await http_get(limited, "/metrics")).text
    for limit in requests:
        assert f'stunner_cds_refusals_total{{limit="{limit}"}} 1.0' in text, limit
