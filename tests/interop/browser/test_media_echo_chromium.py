"""A browser video call through the local stack: headless Chromium → stunnerd → aiortc and back.

The stack is the one `make run` starts, as separate processes (redis-server, the operator on a
copy of examples/local, the CDS, a stunnerd), plus the auth service and the media echo backend
(scripts/media_echo.py), which serves the page. Chromium opens the page with a fake camera; the
page takes its RTCConfiguration from the auth service's /ice, may use relay candidates only,
sends video to the aiortc echo server and decodes what comes back. Deleting the UDPRoute must
stop the media: stunnerd drops the packets and the browser's ICE connection goes down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from interop.stunnerd.test_stunnerd_chromium import chromium

from support.auth import running_auth
from support.devtools import Evaluate, devtools_page
from support.media_echo import media_echo
from support.processes import which
from support.security_stack import Stack, running_stack

pytestmark = [pytest.mark.interop, pytest.mark.timeout(150)]

FRAMES = 30
"""Frames that must come back decoded before the call counts as working."""
QUIET_TICKS = 4
"""Stats polls of the page (every 0.5 s) in which nothing may arrive once the route is gone."""
STEP_TIMEOUT_S = 45.0
FAKE_MEDIA = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream")


async def page_state_when(evaluate: Evaluate, condition: str, what: str) -> dict[str, Any]:
    """The page's `mediaState` once `condition` (JS, over `s`) holds or the call failed."""
    expression = (
        "new Promise(r => { const f = () => { const s = window.mediaState; "
        f"if (s && (s.phase === 'failed' || ({condition}))) r(s); else setTimeout(f, 100); }}; "
        "f(); })"
    )
    try:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            state: dict[str, Any] = await evaluate(expression)
    except TimeoutError:
        last = await evaluate("window.mediaState")
        raise AssertionError(f"timed out waiting for {what}; the page says {last}") from None
    assert state["phase"] != "failed", state
    return state


def cluster_packets(status: dict[str, Any]) -> int:
    return sum(
        c["stats"]["rx"]["pkts"] + c["stats"]["tx"]["pkts"]
        for c in status.get("clusters", [])
        if c.get("stats")
    )


async def test_chromium_video_goes_through_stunnerd_to_the_echo_server_until_the_route_goes(
    tmp_path: Path,
) -> None:
    binary = which("chromium", "/usr/lib/chromium") or which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed")
    async with running_stack(tmp_path / "stack", debug=False, token=False) as stack:
        try:
            await calls(stack, binary, tmp_path)
        except BaseException:
            print(stack.tail())
            with contextlib.suppress(OSError):
                print((tmp_path / "media-echo.log").read_text(errors="replace"))
            raise


@contextlib.asynccontextmanager
async def browser(binary: str, url: str, profile: Path, *args: str) -> AsyncIterator[Evaluate]:
    async with chromium(binary, url, profile, *args) as browser_ws, devtools_page(browser_ws) as ev:
        yield ev


async def calls(stack: Stack, binary: str, tmp_path: Path) -> None:
    before = await stack.status()
    cds = f"http://127.0.0.1:{stack.cds_ports[0]}"
    query = {"service": "turn", "namespace": "stunner", "gateway": "udp-gateway"}
    turn_uri = f"turn:127.0.0.1:{stack.udp_port}?transport=udp"
    frames_back = f"s.received.frames >= {FRAMES}"
    async with running_auth(cds, cors_origins="*") as auth:
        ice_url = f"{auth.url}/ice?{urlencode({**query, 'iceTransportPolicy': 'relay'})}"
        async with (
            media_echo(tmp_path / "media-echo.log", ice_url) as page,
            httpx.AsyncClient(timeout=5.0) as http,
        ):
            # The fake camera: frames go out and come back, relayed by stunnerd.
            async with browser(binary, f"{page}/", tmp_path / "camera", *FAKE_MEDIA) as evaluate:
                state = await page_state_when(evaluate, frames_back, "frames to come back")
            assert state["source"] == "camera", state
            assert state["iceServers"] == [turn_uri], state
            pair = state["pair"]
            assert pair["local"]["type"] == "relay", state
            assert pair["local"]["url"] == turn_uri, state
            assert pair["remote"]["address"] == "127.0.0.1", state  # the echo server's host
            assert state["sent"]["frames"] >= FRAMES, state
            assert state["received"]["width"] > 0, state
            echoed = (await http.get(f"{page}/stats")).json()
            assert echoed["answered"] == 1, echoed
            assert echoed["frames_echoed"] >= FRAMES, echoed
            during = await stack.status()
            assert cluster_packets(during) >= cluster_packets(before) + 2 * FRAMES, during

            # The generated test pattern, and then the route goes away under the call.
            url = f"{page}/?source=pattern"
            async with browser(binary, url, tmp_path / "pattern") as evaluate:
                state = await page_state_when(evaluate, frames_back, "the pattern to come back")
                assert state["source"] == "test pattern", state
                assert state["pair"]["local"]["type"] == "relay", state

                (stack.manifests / "route.yaml").unlink()
                await stack.wait_status(lambda s: not s.get("clusters"), "the route to be gone")
                await page_state_when(
                    evaluate,
                    "['disconnected', 'failed'].includes(s.iceConnectionState)",
                    "the browser to lose its ICE connection",
                )
                quiet = await evaluate("window.mediaState")
                quiet_echoed = (await http.get(f"{page}/stats")).json()
                later = await page_state_when(
                    evaluate, f"s.ticks >= {quiet['ticks'] + QUIET_TICKS}", "more stats polls"
                )
            assert later["received"]["packets"] == quiet["received"]["packets"], (quiet, later)
            assert later["sent"]["packets"] > quiet["sent"]["packets"], (quiet, later)
            later_echoed = (await http.get(f"{page}/stats")).json()
            assert later_echoed["answered"] == 2, later_echoed
            assert later_echoed["frames_echoed"] == quiet_echoed["frames_echoed"], later_echoed
