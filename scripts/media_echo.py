"""A WebRTC echo server behind stunnerd: the media backend a browser calls in the local stack.

python scripts/media_echo.py [--host 127.0.0.1] [--port 8090] [--ice-url URL]

It serves a page (scripts/media_echo.html) that fetches an RTCConfiguration from the auth
service's /ice, forces relay-only ICE, sends the camera (or a test pattern) and shows what comes
back. Signalling is one HTTP POST (/offer: the browser's offer in, the answer out, no trickle).
The server is an aiortc peer whose only ICE candidate is a host candidate on --ice-address
(127.0.0.1): a UDPRoute must admit that address, so the media flows browser → stunnerd → here
and every video frame it receives goes back on the same connection. /stats counts the frames.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioice.ice
import uvicorn
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from av.frame import Frame
from av.packet import Packet
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

log = logging.getLogger("media-echo")

PAGE = Path(__file__).with_name("media_echo.html")
MAX_CALLS = 4
MAX_OFFER_BYTES = 64 * 1024
OFFER_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 5.0


def pin_host_candidates(address: str) -> None:
    """Gather one host candidate, on `address` (aioice skips loopback and uses every interface)."""

    def addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [address]

    aioice.ice.get_host_addresses = addresses


class EchoTrack(MediaStreamTrack):
    """Sends back every frame its source track receives, counting them in `call`."""

    def __init__(self, source: MediaStreamTrack, call: Call) -> None:
        super().__init__()
        self.kind = source.kind
        self.source = source
        self.call = call

    async def recv(self) -> Frame | Packet[Any]:
        frame = await self.source.recv()
        self.call.frames += 1
        return frame


@dataclass(eq=False)
class Call:
    number: int
    pc: RTCPeerConnection
    frames: int = 0
    watchdog: asyncio.Task[None] | None = None


@dataclass
class Calls:
    """The live calls and what was counted since start; a call that does not connect in
    `connect_timeout_s` (the page was closed, ICE failed) or whose connection fails is hung up."""

    ice_url: str
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    live: dict[RTCPeerConnection, Call] = field(default_factory=dict)
    answered: int = 0
    frames_done: int = 0

    async def answer(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        # No STUN or TURN servers of its own: aiortc's default is a public STUN server.
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.answered += 1
        call = self.live[pc] = Call(self.answered, pc)

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            log.info("call %d: echoing a %s track", call.number, track.kind)
            pc.addTrack(EchoTrack(track, call))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            log.info("call %d: %s", call.number, pc.connectionState)
            if pc.connectionState in ("failed", "closed"):
                await self.hang_up(pc)

        try:
            async with asyncio.timeout(OFFER_TIMEOUT_S):
                await pc.setRemoteDescription(offer)
                await pc.setLocalDescription(await pc.createAnswer())
        except BaseException:
            await self.hang_up(pc)
            raise
        call.watchdog = asyncio.create_task(self._watch(call), name=f"call-{call.number}-watchdog")
        return pc.localDescription

    async def _watch(self, call: Call) -> None:
        await asyncio.sleep(self.connect_timeout_s)
        if call.pc.connectionState != "connected":
            log.info("call %d: not connected after %.0f s", call.number, self.connect_timeout_s)
            await self.hang_up(call.pc)

    async def hang_up(self, pc: RTCPeerConnection) -> None:
        call = self.live.pop(pc, None)
        if call is not None:
            self.frames_done += call.frames
            if call.watchdog is not None and call.watchdog is not asyncio.current_task():
                call.watchdog.cancel()
            log.info("call %d: hung up after %d frames", call.number, call.frames)
        await pc.close()

    async def close(self) -> None:
        for pc in list(self.live):
            await self.hang_up(pc)

    def stats(self) -> dict[str, Any]:
        return {
            "calls": len(self.live),
            "answered": self.answered,
            "frames_echoed": self.frames_done + sum(c.frames for c in self.live.values()),
        }


def create_app(calls: Calls) -> Starlette:
    async def page(_: Request) -> Response:
        return FileResponse(PAGE, media_type="text/html; charset=utf-8")

    async def config(_: Request) -> Response:
        return JSONResponse({"ice": calls.ice_url})

    async def offer(request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_OFFER_BYTES:
            return JSONResponse({"error": "offer too large"}, status_code=413)
        try:
            data = json.loads(body)
            description = RTCSessionDescription(sdp=str(data["sdp"]), type=str(data["type"]))
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "expected JSON {sdp, type}"}, status_code=400)
        if description.type != "offer":
            return JSONResponse({"error": "expected an offer"}, status_code=400)
        if "\nm=" not in description.sdp:
            return JSONResponse({"error": "the offer has no media section"}, status_code=400)
        if len(calls.live) >= MAX_CALLS:
            return JSONResponse({"error": f"busy: {MAX_CALLS} calls"}, status_code=503)
        try:
            answer = await calls.answer(description)
        except (ValueError, TimeoutError) as exc:
            return JSONResponse({"error": f"cannot answer: {exc}"}, status_code=400)
        return JSONResponse({"sdp": answer.sdp, "type": answer.type})

    async def stats(_: Request) -> Response:
        return JSONResponse(calls.stats())

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            async with asyncio.timeout(SHUTDOWN_TIMEOUT_S):
                await calls.close()

    return Starlette(
        routes=[
            Route("/", page),
            Route("/config", config),
            Route("/offer", offer, methods=["POST"]),
            Route("/stats", stats),
        ],
        lifespan=lifespan,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="HTTP listen address")
    parser.add_argument("--port", type=int, default=8090, help="HTTP port (0: any free port)")
    parser.add_argument(
        "--ice-address", default="127.0.0.1", help="the address of the one ICE candidate"
    )
    parser.add_argument(
        "--connect-timeout-s",
        type=float,
        default=CONNECT_TIMEOUT_S,
        help="hang up a call whose WebRTC connection is not up after this long",
    )
    parser.add_argument(
        "--ice-url",
        default="http://127.0.0.1:8088/ice?service=turn&iceTransportPolicy=relay",
        help="the auth service's /ice that the page fetches its RTCConfiguration from",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    host, port = sock.getsockname()[:2]
    calls = Calls(args.ice_url, args.connect_timeout_s)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(calls), log_config=None, access_log=False, timeout_graceful_shutdown=2
        )
    )
    log.info(
        "page and signalling on http://%s:%d/ (ICE candidate %s)", host, port, args.ice_address
    )
    await server.serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    pin_host_candidates(args.ice_address)
    try:
        asyncio.run(serve(args))
    except OSError as exc:
        print(f"media_echo: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
