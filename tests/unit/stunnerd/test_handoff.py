"""The handoff document and socket: versions, validation, fds in batches, who may take them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from stunnerd.handoff.transport.channel import (
    FDS_PER_MESSAGE,
    HandoffError,
    HandoffRefusedError,
    HandoffServer,
    Offer,
    private_directory,
    take_over,
)
from stunnerd.handoff.transport.state import (
    VERSION,
    AllocationRecord,
    ChannelRecord,
    HandoffFormatError,
    HandoffState,
    ListenerRecord,
    SocketRecord,
    decode_state,
    encode_state,
)

STATE = HandoffState(
    listeners=(
        ListenerRecord(
            "ns/gw/udp",
            (
                AllocationRecord(
                    client=("127.0.0.1", 40000),
                    user_id="user-1",
                    key=bytes(range(16)),
                    username="user-1",
                    relay=("127.0.0.1", 50000),
                    family=4,
                    expires_in_s=512.5,
                    additional=("::1", 50002),
                    permissions={"10.0.0.1": 250.0},
                    channels=(
                        ChannelRecord(0x4000, ("10.0.0.1", 9000), 590.0),
                        ChannelRecord(0x7FFF, ("10.0.0.1", 9001), 590.0),  # RFC 5766's range
                    ),
                ),
            ),
        ),
        ListenerRecord("ns/gw/tcp"),
    ),
    nonce_key=b"\x01" * 32,
    sockets=(SocketRecord("udp", "127.0.0.1", 3478), SocketRecord("tcp", "::", 3479)),
)


def test_the_state_document_round_trips() -> None:
    assert decode_state(encode_state(STATE)) == STATE
    assert STATE.allocation_count() == 1
    assert STATE.relay_addresses() == [("127.0.0.1", 50000), ("::1", 50002)]
    assert STATE.fd_count() == 4  # the listener sockets, then the relay sockets


def _doc() -> dict[str, object]:
    doc: dict[str, object] = json.loads(encode_state(STATE))
    return doc


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d.update(version=VERSION + 1), "state version 2 cannot be read here"),
        (lambda d: d.update(format="other"), "not a stunnerd-handoff document"),
        (lambda d: d["listeners"][0]["allocations"][0].update(family=5), "family"),
        (lambda d: d["listeners"][0]["allocations"][0].update(relay=["x", 70000]), "relay"),
        (lambda d: d["listeners"][0]["allocations"][0].update(key="zz"), "not hexadecimal"),
        (
            lambda d: d["listeners"][0]["allocations"][0]["channels"][0].update(number=7),
            "not a channel number",
        ),
        (
            lambda d: d["listeners"][0]["allocations"][0]["channels"][0].update(number=0x8000),
            "not a channel number",
        ),
        (
            lambda d: d["listeners"][0]["allocations"][0]["permissions"].update({"1.2.3.4": -1}),
            "non-negative",
        ),
        (lambda d: d.update(sockets=[["sctp", "127.0.0.1", 1]]), "expected [kind, host, port]"),
        (lambda d: d.update(sockets=[["udp", "127.0.0.1", -1]]), "sockets[0]"),
    ],
)
def test_a_document_that_cannot_be_taken_says_why(change: object, says: str) -> None:
    doc = _doc()
    change(doc)  # type: ignore[operator]
    with pytest.raises(HandoffFormatError) as err:
        decode_state(json.dumps(doc).encode())
    assert says in str(err.value)


def test_garbage_is_refused() -> None:
    for data in (b"", b"[]", b"{", b"\xff" * 10):
        with pytest.raises(HandoffFormatError):
            decode_state(data)


@pytest.fixture
def folder() -> Iterator[Path]:
    # Unix socket paths are short (108 bytes): not under pytest's deep tmp_path.
    path = Path(tempfile.mkdtemp(prefix="ho-", dir="/tmp"))
    try:
        yield path / "run"
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Source:
    """Offers `count` fds (one end of socket pairs) and records what happened after."""

    def __init__(self, count: int, refuse: str | None = None) -> None:
        self.pairs = [socket.socketpair() for _ in range(count)]
        self.refuse = refuse
        self.events: list[str] = []
        self.asked: list[int] = []

    async def prepare(self, readable: Sequence[int]) -> Offer:
        self.asked = list(readable)
        if self.refuse:
            raise HandoffRefusedError(self.refuse)
        self.events.append("paused")

        async def resume() -> None:
            self.events.append("resumed")

        async def release() -> None:
            self.events.append("released")

        return Offer(
            encode_state(STATE), VERSION, [a.fileno() for a, _ in self.pairs], resume, release
        )

    def close(self) -> None:
        for a, b in self.pairs:
            a.close()
            b.close()


async def test_a_new_process_takes_every_fd_and_the_old_one_lets_go(folder: Path) -> None:
    count = FDS_PER_MESSAGE * 2 + 3  # three SCM_RIGHTS messages
    source = Source(count)
    server = HandoffServer(folder / "stunnerd.sock", source)
    await server.start()
    try:
        received = await asyncio.to_thread(take_over, folder / "stunnerd.sock", [VERSION])
        assert received is not None
        assert decode_state(received.document) == STATE
        assert len(received.fds) == count
        assert source.asked == [VERSION]
        # Each fd is the very socket: what is written on its peer arrives on the taken copy.
        _, peer = source.pairs[-1]
        peer.send(b"still the same socket")
        taken = socket.socket(fileno=received.fds[-1])
        assert taken.recv(100) == b"still the same socket"
        taken.close()
        for fd in received.fds[:-1]:
            os.close(fd)
        await asyncio.to_thread(received.confirm)
        await asyncio.wait_for(server.handed_over.wait(), 5)
        assert source.events == ["paused", "released"]
    finally:
        await server.close()
        source.close()
    assert not (folder / "stunnerd.sock").exists()


async def test_a_refusal_by_the_new_process_leaves_the_old_one_serving(folder: Path) -> None:
    source = Source(3)
    server = HandoffServer(folder / "s.sock", source)
    await server.start()
    try:
        received = await asyncio.to_thread(take_over, folder / "s.sock", [VERSION])
        assert received is not None
        await asyncio.to_thread(received.refuse, "cannot read it")
        for _ in range(100):
            if source.events == ["paused", "resumed"]:
                break
            await asyncio.sleep(0.02)
        assert source.events == ["paused", "resumed"]
        assert not server.handed_over.is_set()
    finally:
        await server.close()
        source.close()


async def test_an_old_process_that_cannot_offer_a_readable_version_refuses(folder: Path) -> None:
    source = Source(0, refuse="this stunnerd writes state version 1 only; you read 7")
    server = HandoffServer(folder / "s.sock", source)
    await server.start()
    try:
        with pytest.raises(HandoffRefusedError, match="you read 7"):
            await asyncio.to_thread(take_over, folder / "s.sock", [7])
        assert source.events == []
    finally:
        await server.close()
        source.close()


async def test_nothing_to_take_when_no_stunnerd_listens(folder: Path) -> None:
    assert await asyncio.to_thread(take_over, folder / "none.sock", [VERSION]) is None
    private_directory(folder)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(folder / "stale.sock"))
    stale.close()  # the file stays, nobody listens
    assert await asyncio.to_thread(take_over, folder / "stale.sock", [VERSION]) is None


def test_a_directory_others_may_write_is_refused(folder: Path) -> None:
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    with pytest.raises(HandoffError, match="writable by others"):
        private_directory(folder)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_a_directory_of_another_user_is_refused(folder: Path) -> None:
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(HandoffError, match="belongs to uid 65534"):
        private_directory(folder)


def _open_to_everyone(folder: Path, sock: Path) -> None:
    for path in (folder.parent, folder):
        path.chmod(0o755)
    sock.chmod(0o666)


@pytest.mark.skipif(
    os.getuid() != 0 or not os.path.exists("/usr/bin/python3"),
    reason="needs root to act as another user, and the system's python3",
)
async def test_a_peer_of_another_user_is_refused_and_changes_nothing(folder: Path) -> None:
    source = Source(2)
    server = HandoffServer(folder / "s.sock", source)
    await server.start()
    _open_to_everyone(folder, folder / "s.sock")  # only the uid check is left to refuse
    try:
        script = (
            "import socket, sys\n"
            "conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "conn.connect(sys.argv[1])\n"
            "try:\n"
            "    conn.sendall(b'\\x00\\x00\\x00\\x02{}')\n"
            "    data = conn.recv(10)\n"
            "except (BrokenPipeError, ConnectionResetError):\n"
            "    data = b''\n"
            "sys.exit(0 if data == b'' else 2)\n"
        )
        proc = await asyncio.create_subprocess_exec(
            "/usr/bin/python3",  # the venv's may not be readable by that user
            "-c",
            script,
            str(folder / "s.sock"),
            user=65534,
            group=65534,
            cwd="/",
        )
        assert await asyncio.wait_for(proc.wait(), 10) == 0  # closed without an answer
        assert server.refused_peers == 1
        assert source.events == []
        assert source.asked == []
    finally:
        await server.close()
        source.close()


async def test_an_old_process_leaves_the_socket_its_successor_listens_on(folder: Path) -> None:
    """The successor binds the same path before the old process exits: the old one's close
    must not unlink the successor's socket."""
    path = folder / "stunnerd.sock"
    old, new = Source(0), Source(0)
    first, second = HandoffServer(path, old), HandoffServer(path, new)
    await first.start()
    try:
        await second.start()  # replaces the path, as a successor does once it serves
        await first.close()
        assert path.exists()
        received = await asyncio.to_thread(take_over, path, [VERSION])
        assert received is not None
        received.refuse("only checking who answers")
        assert new.asked == [VERSION]
        assert old.asked == []
    finally:
        await first.close()
        await second.close()
    assert not path.exists()
