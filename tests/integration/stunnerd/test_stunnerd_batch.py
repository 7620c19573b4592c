"""UDP GSO batching: every queued datagram arrives intact, in order, as its own datagram."""

from __future__ import annotations

import asyncio
import socket

import pytest

from stunnerd.net.batch import SendBatcher, gso_supported

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def receiver() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


async def receive(sock: socket.socket, count: int) -> list[bytes]:
    loop = asyncio.get_running_loop()
    out = []
    async with asyncio.timeout(5):
        for _ in range(count):
            out.append(await loop.sock_recv(sock, 65536))
    return out


@pytest.mark.parametrize("enabled", [True, False])
async def test_a_burst_to_one_destination_arrives_as_separate_datagrams_in_order(
    enabled: bool,
) -> None:
    if enabled and not gso_supported():
        pytest.skip("this kernel does not support UDP GSO")
    loop = asyncio.get_running_loop()
    batcher = SendBatcher(loop, enabled=enabled)
    payloads = [f"{i:03d}".encode() * 33 for i in range(150)]  # equal sizes, > 64 per burst
    payloads += [b"short", b"x" * 99, b"", b"tail"]  # mixed sizes and an empty datagram
    with receiver() as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.setblocking(False)
        for data in payloads:
            batcher.send(tx, data, rx.getsockname())
        assert await receive(rx, len(payloads)) == payloads


async def test_bursts_to_different_destinations_are_kept_apart() -> None:
    loop = asyncio.get_running_loop()
    batcher = SendBatcher(loop, enabled=gso_supported())
    with (
        receiver() as a,
        receiver() as b,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        tx.setblocking(False)
        for i in range(10):
            batcher.send(tx, b"a%02d" % i, a.getsockname())
            batcher.send(tx, b"b%02d" % i, b.getsockname())
        assert await receive(a, 10) == [b"a%02d" % i for i in range(10)]
        assert await receive(b, 10) == [b"b%02d" % i for i in range(10)]


async def test_a_closed_socket_does_not_break_the_flush() -> None:
    loop = asyncio.get_running_loop()
    batcher = SendBatcher(loop, enabled=True)
    with receiver() as rx:
        dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dead.close()
        batcher.send(dead, b"x", rx.getsockname())
        batcher.send(dead, b"y", rx.getsockname())
        batcher.flush()


async def test_a_datagram_outside_a_burst_leaves_at_once_without_waiting_for_the_loop() -> None:
    batcher = SendBatcher(asyncio.get_running_loop(), enabled=True)
    with receiver() as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        batcher.send(tx, b"now", rx.getsockname())
        rx.settimeout(2.0)  # blocking read: the loop never runs in between
        assert rx.recv(100) == b"now"
