"""The CDS watch's WebSocket client against servers it did not come with.

The `websockets` package's server is the well-behaved peer (fragmented messages, pings, close
codes, refusals, TLS); a raw asyncio server speaks the handshake by hand to break each rule a
client must check. Every server binds port 0 on 127.0.0.1 and is closed by its test.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from stunner_common.io.cds.websocket import (
    ConnectionClosed,
    HandshakeError,
    UpgradeRefused,
    WebSocket,
    connect,
)
from stunner_common.wsframe import TEXT, accept_key, close_payload, encode_frame
from support.turncat_harness import self_signed_cert

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

Handler = Callable[[ServerConnection], Awaitable[None]]


@asynccontextmanager
async def server(handler: Handler, **kwargs: object) -> AsyncIterator[int]:
    async with serve(handler, "127.0.0.1", 0, **kwargs) as srv:  # type: ignore[arg-type]
        yield srv.sockets[0].getsockname()[1]


Raw = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]


@asynccontextmanager
async def raw_server(answer: Raw) -> AsyncIterator[int]:
    """A server that reads the upgrade request and hands the client's key to ``answer``; it waits
    for every ``answer`` to end before it goes."""
    handlers: list[asyncio.Task[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        key = next(
            line.split(":", 1)[1].strip()
            for line in head.split("\r\n")
            if line.lower().startswith("sec-websocket-key:")
        )
        try:
            await answer(reader, writer, key)
        finally:
            writer.close()

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.create_task(handle(reader, writer)))

    srv = await asyncio.start_server(track, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
        await srv.wait_closed()
        async with asyncio.timeout(5):
            await asyncio.gather(*handlers)


def upgrade(key: str, *extra: str) -> bytes:
    lines = [
        "HTTP/1.1 101 Switching Protocols",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Accept: {accept_key(key)}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_messages_arrive_whole_and_in_order_and_headers_reach_the_server(
    no_leaked_tasks: None,
) -> None:
    seen: list[Request] = []

    def process_request(conn: ServerConnection, request: Request) -> None:
        seen.append(request)

    async def handler(conn: ServerConnection) -> None:
        await conn.send("one")
        await conn.send(["fra", "gme", "nted ✓"])  # a message in three frames
        await conn.send(b"\x00\x01")
        await conn.send("x" * 70000)
        await conn.send(b"y" * (3 << 20))  # far past the reader's buffer mark
        await conn.close()

    async with server(handler, subprotocols=["p2"], process_request=process_request) as port:
        ws = await connect(
            f"ws://127.0.0.1:{port}/api/v1/configs?watch=true",
            subprotocols=["p2", "p1"],
            origin="http://127.0.0.1",
            headers={"Authorization": "Bearer t"},
            max_size=4 << 20,
        )
        async with ws:
            got = [message async for message in ws]
        assert ws.subprotocol == "p2"
    assert got == ["one", "fragmented ✓", b"\x00\x01", "x" * 70000, b"y" * (3 << 20)]
    request = seen[0]
    assert request.path == "/api/v1/configs?watch=true"
    assert request.headers["Authorization"] == "Bearer t"
    assert request.headers["Origin"] == "http://127.0.0.1"
    assert request.headers["Sec-WebSocket-Protocol"] == "p2, p1"
    assert "Sec-WebSocket-Extensions" not in request.headers  # no compression offered


async def test_a_server_that_chooses_no_subprotocol_gets_none(no_leaked_tasks: None) -> None:
    async def handler(conn: ServerConnection) -> None:
        await conn.send("v1")
        await conn.wait_closed()

    async with server(handler) as port:
        ws = await connect(f"ws://127.0.0.1:{port}/", subprotocols=["p2"])
        async with ws:
            assert (ws.subprotocol, await ws.recv()) == (None, "v1")


async def test_closing_sends_1000_and_an_abnormal_close_code_is_raised(
    no_leaked_tasks: None,
) -> None:
    codes: list[int | None] = []

    async def handler(conn: ServerConnection) -> None:
        if conn.request is not None and conn.request.path == "/bye":
            await conn.close(4000, "go away")
            return
        await conn.wait_closed()
        codes.append(conn.close_code)

    async with server(handler) as port:
        async with await connect(f"ws://127.0.0.1:{port}/"):
            pass
        ws = await connect(f"ws://127.0.0.1:{port}/bye")
        async with ws:
            with pytest.raises(ConnectionClosed) as closed:
                async for _ in ws:
                    pass
            with pytest.raises(ConnectionClosed):
                await ws.recv()  # the end stays the end
        await asyncio.sleep(0.05)
    assert (closed.value.code, closed.value.reason, closed.value.ok) == (4000, "go away", False)
    assert codes == [1000]


async def test_the_servers_pings_are_answered_and_ours_kept_alive(no_leaked_tasks: None) -> None:
    latencies: list[float] = []

    async def handler(conn: ServerConnection) -> None:
        latencies.append(await asyncio.wait_for(await conn.ping(), 5))
        await conn.send("pinged")
        await conn.wait_closed()

    async with server(handler, ping_interval=None) as port:
        ws = await connect(f"ws://127.0.0.1:{port}/", ping_interval_s=0.05, ping_timeout_s=1)
        async with ws:
            assert await ws.recv() == "pinged"
            await asyncio.sleep(0.3)  # a few keepalive rounds, each answered
            assert ws.ping() is not None
    assert len(latencies) == 1


async def drain(ws: WebSocket) -> None:
    """Take messages until the end (at most 100)."""
    for _ in range(100):
        await ws.recv()


async def test_closing_with_messages_not_taken_still_ends_cleanly(no_leaked_tasks: None) -> None:
    codes: list[int | None] = []

    async def handler(conn: ServerConnection) -> None:
        for n in range(100):  # far more than the client queues
            await conn.send(str(n))
        await conn.wait_closed()
        codes.append(conn.close_code)

    async with server(handler) as port:
        ws = await connect(f"ws://127.0.0.1:{port}/")
        async with ws:
            assert await ws.recv() == "0"
            await asyncio.sleep(0.1)  # the reader stops at its bound
        with pytest.raises(ConnectionClosed) as closed:
            await drain(ws)
        await asyncio.sleep(0.05)
    # The reader went on to the server's close frame (not cut off after waiting for it).
    assert closed.value.code == 1000
    assert codes == [1000]


async def test_a_cancelled_reader_leaves_no_task_and_the_server_sees_a_close(
    no_leaked_tasks: None,
) -> None:
    codes: list[int | None] = []

    async def handler(conn: ServerConnection) -> None:
        await conn.wait_closed()
        codes.append(conn.close_code)

    async def follow(port: int) -> None:
        async with await connect(f"ws://127.0.0.1:{port}/", ping_interval_s=0.05) as ws:
            await ws.recv()  # nothing comes: cancelled here

    async with server(handler) as port:
        task = asyncio.create_task(follow(port))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
    assert codes == [1000]


async def test_a_message_over_the_size_limit_closes_with_1009(no_leaked_tasks: None) -> None:
    codes: list[int | None] = []

    async def handler(conn: ServerConnection) -> None:
        await conn.send("y" * 2000)
        await conn.wait_closed()
        codes.append(conn.close_code)

    async with server(handler) as port:
        async with await connect(f"ws://127.0.0.1:{port}/", max_size=1000) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        await asyncio.sleep(0.05)
    assert closed.value.code == 1009
    assert codes == [1009]


async def test_a_refusal_carries_its_status_and_body(no_leaked_tasks: None) -> None:
    def process_request(conn: ServerConnection, request: Request) -> Response:
        return conn.respond(401, "bad token\n")

    async def handler(conn: ServerConnection) -> None:
        raise AssertionError("never accepted")

    async with server(handler, process_request=process_request) as port:
        with pytest.raises(UpgradeRefused) as refused:
            await connect(f"ws://127.0.0.1:{port}/")
    assert (refused.value.status, refused.value.body) == (401, b"bad token\n")


async def test_a_chunked_refusal_body_is_read(no_leaked_tasks: None) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
        writer.write(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"4\r\nno s\r\n7\r\nuch gw\n\r\n0\r\n\r\n"
        )
        await writer.drain()

    async with raw_server(answer) as port:
        with pytest.raises(UpgradeRefused) as refused:
            await connect(f"ws://127.0.0.1:{port}/")
    assert (refused.value.status, refused.value.body) == (404, b"no such gw\n")


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (("Sec-WebSocket-Protocol: other",), "subprotocol 'other'"),
        (("Sec-WebSocket-Extensions: permessage-deflate",), "extension"),
    ],
)
async def test_a_101_that_breaks_the_handshake_is_refused(
    no_leaked_tasks: None, extra: tuple[str, ...], why: str
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
        writer.write(upgrade(key, *extra))
        await writer.drain()

    async with raw_server(answer) as port:
        with pytest.raises(HandshakeError, match=why):
            await connect(f"ws://127.0.0.1:{port}/", subprotocols=["mine"])


async def test_a_wrong_accept_key_or_a_non_http_answer_is_refused(no_leaked_tasks: None) -> None:
    async def wrong_key(reader: asyncio.StreamReader, w: asyncio.StreamWriter, key: str) -> None:
        w.write(upgrade("another key"))
        await w.drain()

    async def garbage(reader: asyncio.StreamReader, w: asyncio.StreamWriter, key: str) -> None:
        w.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await w.drain()

    async with raw_server(wrong_key) as port:
        with pytest.raises(HandshakeError, match="Accept"):
            await connect(f"ws://127.0.0.1:{port}/")
    async with raw_server(garbage) as port:
        with pytest.raises(HandshakeError, match="status line"):
            await connect(f"ws://127.0.0.1:{port}/")
    with pytest.raises(HandshakeError, match="ws://"):
        await connect("http://127.0.0.1:1/")


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (bytes((0x81, 0x82)) + b"\x00\x00\x00\x00hi", 1002),  # masked, from a server
        (encode_frame(TEXT, b"\xff\xfe"), 1007),  # text that is not UTF-8
        (bytes((0x80, 1)) + b"x", 1002),  # a continuation with nothing to continue
    ],
)
async def test_a_frame_that_breaks_a_rule_closes_with_its_code(
    no_leaked_tasks: None, frame: bytes, code: int
) -> None:
    got: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
        writer.write(upgrade(key) + encode_frame(TEXT, b"fine") + frame)
        await writer.drain()
        got.append(await reader.read(64))

    async with raw_server(answer) as port, await connect(f"ws://127.0.0.1:{port}/") as ws:
        assert await ws.recv() == "fine"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.code == code
    assert [frame[0] for frame in got] == [0x88]  # our close frame reached the server


async def test_a_silent_server_fails_the_keepalive(no_leaked_tasks: None) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
        writer.write(upgrade(key))
        await writer.drain()
        await reader.read()  # answers no ping; ends when the client hangs up

    async with raw_server(answer) as port:
        ws = await connect(f"ws://127.0.0.1:{port}/", ping_interval_s=0.05, ping_timeout_s=0.1)
        async with ws:
            with pytest.raises(ConnectionClosed, match="keepalive"):
                await ws.recv()


async def test_the_server_closing_without_a_close_frame_is_1006(no_leaked_tasks: None) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
        writer.write(upgrade(key) + encode_frame(TEXT, b"last"))
        await writer.drain()

    async with raw_server(answer) as port, await connect(f"ws://127.0.0.1:{port}/") as ws:
        assert await ws.recv() == "last"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.code == 1006


async def test_a_close_frame_from_the_server_is_echoed(no_leaked_tasks: None) -> None:
    got: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
        writer.write(upgrade(key) + encode_frame(0x8, close_payload(1001, "restart")))
        await writer.drain()
        got.append(await reader.read(64))

    async with raw_server(answer) as port, await connect(f"ws://127.0.0.1:{port}/") as ws:
        assert [m async for m in ws] == []  # 1001 is a normal end
    assert got[0][:2] == bytes((0x88, 0x80 | 9))  # a masked close with the same 9-byte payload


async def test_wss_with_the_callers_trust(no_leaked_tasks: None, tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def handler(conn: ServerConnection) -> None:
        await conn.send("secret")
        await conn.wait_closed()

    async with server(handler, ssl=server_ctx) as port:
        with pytest.raises(ssl.SSLError):
            await connect(f"wss://127.0.0.1:{port}/")  # the system's trust does not know it
        client_ctx = ssl.create_default_context(cafile=str(cert))
        async with await connect(f"wss://127.0.0.1:{port}/", ssl_context=client_ctx) as ws:
            assert await ws.recv() == "secret"
