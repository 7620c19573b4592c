"""aioice's TURN client (an independent implementation) allocates and relays through stunnerd."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest
from aioice.turn import create_turn_endpoint
from fixtures.stunnerd.inproc import make_config, running_server

from support.echo import echo_peer
from support.stunnerd_process import PASSWORD, USER

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

ROUNDS = 50


class Collector(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[bytes, Any]] = asyncio.Queue()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.queue.put_nowait((data, addr))


def client_tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the listener's certificate is a throwaway self-signed one
    return ctx


@pytest.mark.parametrize(
    ("proto", "transport", "use_tls"),
    [("TURN-UDP", "udp", False), ("TURN-TCP", "tcp", False), ("TURN-TLS", "tcp", True)],
)
async def test_aioice_client_echoes_through_the_relay(
    no_leaked_tasks: None, proto: str, transport: str, use_tls: bool
) -> None:
    config = make_config((proto,))
    port = config.listeners[0].port
    async with running_server(config) as server, echo_peer() as (peer, peer_addr):
        turn, collector = await create_turn_endpoint(
            Collector,
            server_addr=("127.0.0.1", port),
            username=USER,
            password=PASSWORD,
            ssl=client_tls() if use_tls else None,
            transport=transport,
        )
        try:
            relayed = turn.get_extra_info("sockname")
            assert relayed[0] == "127.0.0.1"
            assert server.allocation_counts() == {proto.lower(): 1}
            for i in range(ROUNDS):
                payload = f"ping {i}".encode()
                turn.sendto(payload, peer_addr)
                async with asyncio.timeout(5):
                    data, addr = await collector.queue.get()
                assert data == payload
                assert tuple(addr[:2]) == peer_addr
            # the peer saw the relay address the client was given, as upstream's echo tests check
            assert set(peer.senders) == {tuple(relayed)}
        finally:
            turn.close()
            async with asyncio.timeout(5):
                await collector.closed  # aioice deleted its allocation (Refresh 0 / close)
        assert server.allocation_count == 0
