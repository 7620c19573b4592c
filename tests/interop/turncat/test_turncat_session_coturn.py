"""turncat's TurnSession driven in-process against coturn: what only the inside can show."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from support.echo import udp_echo
from support.ports import LOOPBACK
from support.turncat_harness import PASSWORD, USER, coturn
from turncat.carrier import TlsOptions
from turncat.errors import AuthFailedError
from turncat.session import TurnSession
from turncat.settings import TurncatSettings

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


def _session(
    port: int,
    peer_port: int,
    queue: asyncio.Queue[bytes],
    password: str = PASSWORD,
    transport: str = "udp",
) -> TurnSession:
    return TurnSession(
        transport=transport,  # type: ignore[arg-type]
        server=(LOOPBACK, port),
        peer=(LOOPBACK, peer_port),
        credentials=lambda: (USER, password),
        tls=TlsOptions(),
        settings=TurncatSettings(),
        on_data=queue.put_nowait,
        name="test",
    )


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_data_from_anyone_but_the_peer_is_dropped(
    tmp_path: Path, no_leaked_tasks: None, transport: str
) -> None:
    received: asyncio.Queue[bytes] = asyncio.Queue()
    with coturn(tmp_path) as server:
        async with udp_echo() as echo:
            session = _session(server.port, echo.port, received, transport=transport)
            await session.open()
            try:
                assert session.relayed_address is not None
                # coturn's permission covers the peer's IP, so a stranger on the same IP but
                # another port reaches the relay; it arrives as a Data indication we must drop.
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rogue:
                    rogue.bind((LOOPBACK, 0))
                    for _ in range(3):
                        rogue.sendto(b"rogue", session.relayed_address)
                    session.send(b"legit")
                    async with asyncio.timeout(5):
                        assert await received.get() == b"legit"
                    # The rogue datagrams went out first and reached the session too.
                    async with asyncio.timeout(5):
                        while session.dropped < 3:
                            session.send(b"legit")
                            assert await received.get() == b"legit"
                assert received.empty()
                assert session.dropped >= 3
            finally:
                await session.close()


async def test_wrong_password_raises_auth_failed_and_leaves_nothing_running(
    tmp_path: Path, no_leaked_tasks: None
) -> None:
    received: asyncio.Queue[bytes] = asyncio.Queue()
    with coturn(tmp_path) as server:
        async with udp_echo() as echo:
            session = _session(server.port, echo.port, received, password="wrong")
            with pytest.raises(AuthFailedError, match="rejected user 'user1'"):
                await session.open()
            assert not session.is_open
