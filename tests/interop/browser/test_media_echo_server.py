"""The media echo server's HTTP edge, with aiortc as the client and no browser.

Its answer must carry host candidates on 127.0.0.1 only (what the local UDPRoute admits, and never
a public STUN server's reflexive address); bad offers get a 4xx and one line; a call that never
connects is hung up, so an abandoned page does not hold one of the server's few call slots.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aioice.ice
import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from support.media_echo import media_echo

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

ICE_URL = "http://127.0.0.1:9/ice?service=turn&iceTransportPolicy=relay"
HANGUP_TIMEOUT_S = 20.0
POLL_S = 0.1


async def offer_without_candidates(monkeypatch: pytest.MonkeyPatch) -> str:
    """A real offer (video, both ways) without its candidates: it can never connect."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda **_: ["127.0.0.1"])
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("video", direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        lines = pc.localDescription.sdp.splitlines(keepends=True)
    finally:
        await pc.close()
    # Without end-of-candidates, as a trickling client: the server waits for candidates.
    return "".join(line for line in lines if not line.startswith(("a=candidate", "a=end-of-")))


async def test_the_echo_server_answers_from_loopback_refuses_bad_offers_and_drops_dead_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdp = await offer_without_candidates(monkeypatch)
    log = tmp_path / "media-echo.log"
    async with (
        media_echo(log, ICE_URL, "--connect-timeout-s", "1") as url,
        httpx.AsyncClient(timeout=10.0) as http,
    ):
        page = await http.get(f"{url}/")
        assert page.status_code == 200
        assert 'config.iceTransportPolicy = "relay"' in page.text
        assert (await http.get(f"{url}/config")).json() == {"ice": ICE_URL}

        for body, code in (
            (b"not json", 400),
            (json.dumps({"type": "offer"}).encode(), 400),
            (json.dumps({"sdp": sdp, "type": "answer"}).encode(), 400),
            (json.dumps({"sdp": "v=0\r\nnonsense\r\n", "type": "offer"}).encode(), 400),
            (b" " * (64 * 1024 + 1), 413),
        ):
            reply = await http.post(f"{url}/offer", content=body)
            assert reply.status_code == code, (body[:60], reply.text)
            assert set(reply.json()) == {"error"}, reply.text

        reply = await http.post(f"{url}/offer", json={"sdp": sdp, "type": "offer"})
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert answer["type"] == "answer"
        candidates = [ln for ln in answer["sdp"].splitlines() if ln.startswith("a=candidate")]
        assert candidates, answer["sdp"]
        hosts = [(ln.split()[4], ln.split()[6:8]) for ln in candidates]
        assert all(h == ("127.0.0.1", ["typ", "host"]) for h in hosts), candidates
        assert "m=video" in answer["sdp"]
        assert (await http.get(f"{url}/stats")).json()["calls"] == 1

        for _poll in range(int(HANGUP_TIMEOUT_S / POLL_S)):
            stats = (await http.get(f"{url}/stats")).json()
            if not stats["calls"]:
                break
            await asyncio.sleep(POLL_S)
        assert stats == {"calls": 0, "answered": 1, "frames_echoed": 0}
    assert "call 1: not connected after 1 s" in log.read_text(), log.read_text()
