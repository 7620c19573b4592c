"""The one CDS client (``stunner_common.io.cds.CdsClient``) against small loopback servers.

The stunnerd origin and turncat both ride on this client; their own tests cover what they make
of its answers. Here: the bearer token on both paths, how failures are classified, the size cap.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from stunner_common.backoff import Backoff
from stunner_common.cds import (
    CDS_V2_SUBPROTOCOL,
    CdsHttpError,
    CdsUnreachableError,
    ConfigChange,
    ConfigFrame,
    encode_snapshot,
)
from stunner_common.io.cds import CdsClient
from support.ports import free_port

pytestmark = pytest.mark.integration

FAST = Backoff(initial_s=0.01, cap_s=0.05)


async def _responder(status: int, body: bytes) -> tuple[asyncio.Server, list[bytes]]:
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

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


async def _get(
    status: int, body: bytes, **kwargs: object
) -> tuple[bytes | BaseException, list[bytes]]:
    server, seen = await _responder(status, body)
    port = server.sockets[0].getsockname()[1]
    try:
        client = CdsClient(f"127.0.0.1:{port}", **kwargs)  # type: ignore[arg-type]
        try:
            return await client.get("ns", "gw", {"node": "n1"}), seen
        except Exception as exc:
            return exc, seen
    finally:
        server.close()
        await server.wait_closed()


async def test_a_get_returns_the_body_and_sends_the_bearer_token(no_leaked_tasks: None) -> None:
    got, seen = await _get(200, b'{"ok": true}', token="s3cret")
    assert got == b'{"ok": true}'
    head = seen[0].decode()
    assert head.startswith("GET /api/v1/configs/ns/gw?node=n1 HTTP/1.1\r\n")
    assert "authorization: bearer s3cret\r\n" in head.lower()


async def test_a_get_without_a_token_sends_no_authorization(no_leaked_tasks: None) -> None:
    _, seen = await _get(200, b"{}")
    assert b"authorization" not in seen[0].lower()


async def test_a_non_200_answer_is_an_http_error_with_status_and_body(
    no_leaked_tasks: None,
) -> None:
    got, _ = await _get(404, b'{"code":404,"message":"not found"}\n')
    assert isinstance(got, CdsHttpError)
    assert got.status == 404
    assert got.body == '{"code":404,"message":"not found"}'
    assert "status: 404" in str(got)


async def test_an_answer_over_the_size_cap_is_refused(no_leaked_tasks: None) -> None:
    got, _ = await _get(200, b"x" * 5000, max_size=1000)
    assert isinstance(got, CdsUnreachableError)
    assert "larger than 1000 bytes" in str(got)


async def test_a_closed_port_is_unreachable(no_leaked_tasks: None) -> None:
    client = CdsClient(f"127.0.0.1:{free_port()}", timeout_s=2.0)
    with pytest.raises(CdsUnreachableError):
        await client.get("ns", "gw")


@pytest.fixture
async def ws_server() -> AsyncIterator[tuple[int, list[Headers], list[int]]]:
    """A v2 server that refuses with the next status of ``refuse`` (then accepts)."""
    seen: list[Headers] = []
    refuse: list[int] = []

    def process_request(conn: ServerConnection, request: Request) -> Response | None:
        seen.append(request.headers)
        if refuse:
            return conn.respond(refuse.pop(0), "no\n")
        return None

    async def handler(conn: ServerConnection) -> None:
        await conn.send(encode_snapshot("ns/gw", 3, {"auth": {"realm": "r"}}))
        await conn.wait_closed()

    async with serve(
        handler,
        "127.0.0.1",
        0,
        subprotocols=[Subprotocol(CDS_V2_SUBPROTOCOL)],
        process_request=process_request,
    ) as server:
        yield server.sockets[0].getsockname()[1], seen, refuse


async def _first(client: CdsClient, **kwargs: object) -> ConfigChange | ConfigFrame:
    async with asyncio.timeout(5):
        async for item in client.watch("ns", "gw", backoff=FAST, **kwargs):  # type: ignore[arg-type]
            return item
    raise AssertionError("the watch ended")


async def test_a_watch_sends_the_bearer_token_and_yields_the_snapshot(
    no_leaked_tasks: None, ws_server: tuple[int, list[Headers], list[int]]
) -> None:
    port, seen, _ = ws_server
    client = CdsClient(f"ws://127.0.0.1:{port}", token="s3cret")
    item = await _first(client)
    assert item == ConfigChange("ns/gw", 3, {"auth": {"realm": "r"}})
    assert seen[0]["Authorization"] == "Bearer s3cret"
    assert (client.attempts, client.connects) == (1, 1)


async def test_a_refused_watch_raises_for_a_tool_and_is_retried_for_a_daemon(
    no_leaked_tasks: None, ws_server: tuple[int, list[Headers], list[int]]
) -> None:
    port, _, refuse = ws_server
    refuse.append(401)
    with pytest.raises(CdsHttpError) as refused:
        await _first(CdsClient(f"127.0.0.1:{port}"))
    assert refused.value.status == 401
    refuse.extend([401, 503])
    daemon = CdsClient(f"127.0.0.1:{port}")
    item = await _first(daemon, give_up_on_refusal=False)
    assert isinstance(item, ConfigChange)
    assert (daemon.attempts, daemon.connects) == (3, 1)


async def test_a_server_without_the_subprotocol_yields_whole_config_frames(
    no_leaked_tasks: None,
) -> None:
    async def handler(conn: ServerConnection) -> None:
        await conn.send(json.dumps({"version": "v1"}))
        await conn.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        item = await _first(CdsClient(f"127.0.0.1:{port}"))
    assert item == ConfigFrame('{"version": "v1"}')
