"""Byte streams of the tunnel: stdin, and the two ways of an RFC 6062 data connection.

With a TCP peer (RFC 6062) a local TCP client or stdin gets a data connection of its own and
bytes are spliced both ways as they are; when one side ends its stream the other is half-closed
and has `linger_s` of silence to finish. stdin is read through a pipe transport where the event
loop can poll it, else in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import sys
from collections.abc import Callable, Coroutine
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

READ_BYTES = 1500
STREAM_READ_BYTES = 1 << 16

Reader = Callable[[], Coroutine[Any, Any, bytes]]
DataStream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def stdio_stream(
    peer: DataStream, read: Reader, out: BinaryIO, lost: asyncio.Event, linger_s: float
) -> None:
    """stdin to a TCP peer and its bytes to stdout, over one RFC 6062 data connection."""
    peer_reader, peer_writer = peer
    flow = Flow()

    async def upstream() -> None:
        while data := await read():
            flow.moved += 1
            peer_writer.write(data)
            await peer_writer.drain()
        with contextlib.suppress(OSError):
            peer_writer.write_eof()

    async def downstream() -> None:
        while data := await peer_reader.read(STREAM_READ_BYTES):
            flow.moved += 1
            out.write(data)
            out.flush()

    try:
        await flow.run(upstream(), downstream(), lost, linger_s)
    finally:
        peer_writer.close()


async def splice(local: DataStream, peer: DataStream, lost: asyncio.Event, linger_s: float) -> None:
    """Copy bytes both ways between a local TCP client and a data connection until both ends
    are done, the TURN session is lost, or one end finished and the other fell silent."""
    flow = Flow()

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(STREAM_READ_BYTES):
            flow.moved += 1
            dst.write(data)
            await dst.drain()
        with contextlib.suppress(OSError):
            if dst.can_write_eof():
                dst.write_eof()

    try:
        await flow.run(copy(local[0], peer[1]), copy(peer[0], local[1]), lost, linger_s)
    finally:
        peer[1].close()


class Flow:
    """The two directions of a byte stream; `moved` counts reads so silence can be told."""

    def __init__(self) -> None:
        self.moved = 0

    async def run(
        self,
        up: Coroutine[Any, Any, None],
        down: Coroutine[Any, Any, None],
        lost: asyncio.Event,
        linger_s: float,
    ) -> None:
        """Run both directions; once one has ended, stop when the other ends, fails, or moves
        nothing for `linger_s`; stop at once when the session is lost or a direction fails."""
        halves: set[asyncio.Task[Any]] = {
            asyncio.create_task(up, name="stream-up"),
            asyncio.create_task(down, name="stream-down"),
        }
        lost_task: asyncio.Task[Any] = asyncio.create_task(lost.wait(), name="stream-lost")
        try:
            pending = set(halves)
            while pending and not lost.is_set():
                seen = self.moved
                done, _ = await asyncio.wait(
                    pending | {lost_task},
                    timeout=linger_s if len(pending) < len(halves) else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done & halves:
                    pending.discard(task)
                    if not task.cancelled() and task.exception() is not None:
                        log.debug("stream closed: %s", task.exception())
                        return
                if not done and self.moved == seen:
                    return  # one side is done and the other fell silent
        finally:
            for task in (*halves, lost_task):
                task.cancel()
            await asyncio.gather(*halves, lost_task, return_exceptions=True)


async def stdin_reader() -> Reader:
    """A reader of stdin chunks: a pipe transport for pipes, sockets and terminals, a thread
    for everything else (regular files, /dev/null), which the event loop cannot poll (uvloop
    aborts the process on them)."""
    fd = sys.stdin.fileno()
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)):

        async def read_file() -> bytes:
            return await asyncio.to_thread(os.read, fd, READ_BYTES)

        return read_file
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 16)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def read_pipe() -> bytes:
        return await reader.read(READ_BYTES)

    return read_pipe
