"""The one UDP echo server of the tests: a backend (peer) that echoes every datagram.

It records who sent what, so a test can check that datagrams reached it from the relay address
and not from the client. Independent peers (coturn's turnutils_peer) are used where the point is
interoperability; this is the in-process one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

from support.ports import LOOPBACK


class EchoProtocol(asyncio.DatagramProtocol):
    """Echoes every datagram to its sender; `senders` lists the sender of each, in order,
    `sources` the distinct senders."""

    def __init__(self) -> None:
        self.senders: list[tuple[str, int]] = []
        self.sources: set[tuple[str, int]] = set()
        self.received = 0
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # uvloop's is no subclass

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.senders.append(addr[:2])
        self.sources.add(addr[:2])
        self.received += 1
        assert self.transport is not None
        self.transport.sendto(data, addr)


@dataclass
class UdpEcho:
    host: str
    port: int
    protocol: EchoProtocol

    @property
    def addr(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"udp://{host}:{self.port}"


@contextlib.asynccontextmanager
async def udp_echo(
    host: str = LOOPBACK, receive_buffer_bytes: int | None = None
) -> AsyncIterator[UdpEcho]:
    """An echo server on ``host``, port 0; closed when the block ends. ``receive_buffer_bytes``
    makes room for a burst (a relay that was paused sends what it held at once)."""
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(EchoProtocol, local_addr=(host, 0))
    if receive_buffer_bytes is not None:
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    try:
        yield UdpEcho(host, transport.get_extra_info("sockname")[1], proto)
    finally:
        transport.close()


@contextlib.asynccontextmanager
async def echo_peer(host: str = LOOPBACK) -> AsyncIterator[tuple[EchoProtocol, tuple[str, int]]]:
    """`udp_echo` as (protocol, address), the shape the stunnerd tests use."""
    async with udp_echo(host) as echo:
        yield echo.protocol, echo.addr
