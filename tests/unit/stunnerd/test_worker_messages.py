"""The supervisor and its workers speak only the records of `contracts.worker_messages`: no message
is built as a dict literal in `stunnerd.workers`, a worker answers each request with its typed
reply, and a channel message of another version is refused, its fd closed."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import stunnerd.worker_main
import stunnerd.workers
from stunner_common.contracts.worker_messages import (
    PROTOCOL_VERSION,
    ApplyReply,
    ApplyRequest,
    DoneReply,
    FreezeRequest,
    NonceKey,
    PingRequest,
    StatsReply,
    StatsRequest,
    WorkerMessageError,
)
from stunnerd.workers.child import handle
from stunnerd.workers.local import LocalDataplane
from stunnerd.workers.sockets import FdChannel, InheritedSockets

OP_LITERAL = re.compile(r"""["']op["']\s*[:\]),]""")


def test_no_worker_message_is_built_or_read_as_a_dict_in_the_workers_package() -> None:
    package = Path(next(iter(stunnerd.workers.__path__)))
    sources = [*package.rglob("*.py"), Path(stunnerd.worker_main.__file__)]
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sources
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if OP_LITERAL.search(line)
    ]
    assert found == []


@pytest.fixture
async def dataplane() -> AsyncIterator[LocalDataplane]:
    plane = LocalDataplane()
    yield plane
    await plane.close()


async def test_a_worker_answers_each_request_with_its_reply_and_id(
    dataplane: LocalDataplane,
) -> None:
    assert await handle(dataplane, PingRequest(4)) == DoneReply(4)
    assert await handle(dataplane, FreezeRequest(True, 5)) == DoneReply(5)
    stats = await handle(dataplane, StatsRequest(6))
    assert isinstance(stats, StatsReply)
    assert stats.id == 6
    assert stats.stats["listeners"] == []
    assert stats.offload["active"] is False


async def test_an_unreadable_config_is_an_apply_reply_with_the_error(
    dataplane: LocalDataplane,
) -> None:
    reply = await handle(dataplane, ApplyRequest("not a config", id=8))
    assert isinstance(reply, ApplyReply)
    assert (reply.id, reply.applied) == (8, False)
    assert reply.error is not None
    assert reply.error.startswith("invalid config")


def test_a_worker_takes_the_nonce_key_record_and_refuses_another_version() -> None:
    ours, theirs = FdChannel.pair()
    worker = InheritedSockets(FdChannel(theirs))
    try:
        ours.send(NonceKey(b"\x01" * 32))
        assert worker.wait_nonce_key() == b"\x01" * 32
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as relay:
            data = b'{"op":"relay_socket","version":%d}' % (PROTOCOL_VERSION + 1)
            socket.send_fds(ours.sock, [data], [relay.fileno()])
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(WorkerMessageError, match=f"version {PROTOCOL_VERSION + 1}"):
            worker.drain()
        assert set(os.listdir("/proc/self/fd")) <= before  # its fd was closed
        assert worker.take_relays() == []
    finally:
        worker.close()
        ours.close()
