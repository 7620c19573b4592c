"""Named sockets in the handoff: the admin servers' listening sockets travel after the state's
fds, named by role and address, and only to a successor that asks for them."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from stunnerd.handoff.transport.channel import (
    HandoffServer,
    Offer,
    receive_fds,
    receive_message,
    send_message,
    take_over,
)
from stunnerd.handoff.transport.named import NamedSocket
from stunnerd.handoff.transport.state import VERSION, HandoffState, encode_state


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hn-", dir="/tmp"))
    try:
        yield path / "run"
    finally:
        shutil.rmtree(path, ignore_errors=True)


class OneSocketSource:
    """Offers one UDP socket as the state's only fd."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))

    async def prepare(self, readable: Sequence[int]) -> Offer:
        async def nothing() -> None:
            return None

        document = encode_state(HandoffState())
        return Offer(document, VERSION, [self.sock.fileno()], nothing, nothing)


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    try:
        yield sock
    finally:
        sock.close()


async def test_the_admin_sockets_follow_the_state_named_and_are_the_very_sockets(
    folder: Path, listening: socket.socket
) -> None:
    port = listening.getsockname()[1]
    source = OneSocketSource()
    path = folder / "s.sock"
    server = HandoffServer(
        path, source, named=lambda: [NamedSocket("health", "127.0.0.1", port, listening)]
    )
    await server.start()
    try:
        received = await asyncio.to_thread(take_over, path, [VERSION])
        assert received is not None
        assert len(received.fds) == 1  # the state's own fds only
        assert [(n.name, n.host, n.port) for n in received.named] == [("health", "127.0.0.1", port)]
        taken = received.named[0].sock
        assert taken.getsockname() == listening.getsockname()
        # A connection to the old process's port is accepted on the taken socket.
        client = socket.create_connection(("127.0.0.1", port))
        taken.settimeout(2)
        conn, _ = taken.accept()
        conn.close()
        client.close()
        received.refuse("only looking")
        assert received.named == []
    finally:
        await server.close()
        source.sock.close()


async def test_an_older_successor_that_does_not_ask_gets_the_offer_as_before(
    folder: Path, listening: socket.socket
) -> None:
    port = listening.getsockname()[1]
    source = OneSocketSource()
    path = folder / "s.sock"
    server = HandoffServer(
        path, source, named=lambda: [NamedSocket("health", "127.0.0.1", port, listening)]
    )
    await server.start()

    def older() -> tuple[dict[str, object], list[int]]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
            conn.settimeout(5)
            send_message(conn, {"op": "hello", "readable": [VERSION]})
            offer = receive_message(conn)
            size, count = offer["state_bytes"], offer["fds"]
            assert isinstance(size, int)
            assert isinstance(count, int)
            conn.recv(size, socket.MSG_WAITALL)
            fds = receive_fds(conn, count)
            send_message(conn, {"op": "refused", "reason": "only looking"})
            return offer, fds

    try:
        offer, fds = await asyncio.to_thread(older)
        assert offer["fds"] == 1
        assert offer["named"] == []
        for fd in fds:
            socket.socket(fileno=fd).close()
    finally:
        await server.close()
        source.sock.close()
