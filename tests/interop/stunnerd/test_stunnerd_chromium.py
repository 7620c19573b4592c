"""Headless Chromium's own TURN stack relays a DataChannel through stunnerd (UDP and TCP).

The page (tests/fixtures/stunnerd/webrtc_relay.html) holds two RTCPeerConnections restricted to
relay candidates from our server only (`iceTransportPolicy: "relay"`); they open a DataChannel and
echo messages. The test drives the browser over the DevTools protocol and reads the page's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from fixtures.stunnerd.inproc import make_config, running_server

from support.devtools import devtools_page
from support.processes import which
from support.stunnerd_process import PASSWORD, USER

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

PAGE = Path(__file__).resolve().parents[2] / "fixtures" / "stunnerd" / "webrtc_relay.html"
MESSAGES = 20


@contextlib.asynccontextmanager
async def page_server() -> AsyncIterator[int]:
    """Serve the test page on loopback (any path returns it)."""
    body = PAGE.read_bytes()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def chromium(binary: str, url: str, profile: Path, *extra_args: str) -> AsyncIterator[str]:
    """Start headless Chromium on `url` (with `extra_args`); yield its DevTools websocket URL."""
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--allow-loopback-in-peer-connection",
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        *extra_args,
        url,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        seen: list[str] = []
        async with asyncio.timeout(20):
            while True:
                line = (await proc.stderr.readline()).decode(errors="replace")
                if not line:
                    raise RuntimeError("chromium exited:\n" + "".join(seen[-30:]))
                seen.append(line)
                found = re.search(r"DevTools listening on (ws://\S+)", line)
                if found:
                    break
        drain = asyncio.create_task(_drain(proc.stderr), name="chromium-stderr")
        try:
            yield found.group(1)
        finally:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def page_result(browser_ws: str) -> dict[str, Any]:
    expression = (
        "new Promise(r => { const f = () => window.testResult ? "
        "window.testResult.then(r) : setTimeout(f, 50); f(); })"
    )
    async with devtools_page(browser_ws) as evaluate:
        value: dict[str, Any] = await evaluate(expression)
    return value


@pytest.mark.parametrize(("proto", "transport"), [("TURN-UDP", "udp"), ("TURN-TCP", "tcp")])
async def test_chromium_exchanges_datachannel_messages_through_the_relay(
    tmp_path: Path, proto: str, transport: str
) -> None:
    binary = which("chromium", "/usr/lib/chromium") or which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed")
    config = make_config((proto,))
    port = config.listeners[0].port
    query = urlencode(
        {
            "turn": f"turn:127.0.0.1:{port}?transport={transport}",
            "user": USER,
            "pass": PASSWORD,
            "count": MESSAGES,
        }
    )
    async with running_server(config), page_server() as http_port:
        url = f"http://127.0.0.1:{http_port}/relay.html?{query}"
        async with chromium(binary, url, tmp_path / "profile") as browser_ws:
            async with asyncio.timeout(60):
                result = await page_result(browser_ws)
            assert result.get("ok"), result
            assert result["echoed"] == [f"echo:msg {i}" for i in range(MESSAGES)]
            assert result["localType"] == "relay", result
            assert result["remoteType"] == "relay", result
            assert all(" typ relay " in c for c in result["candidates"]["a"]), result
            assert result["relayProtocol"] == transport, result
            assert result["url"] == f"turn:127.0.0.1:{port}?transport={transport}", result
