"""One worker process of a multi-process stunnerd, and the requests in flight to it.

The supervisor (`stunnerd.workers.pool.WorkerPool`) starts each worker as
`python -m stunnerd.worker_main` with its settings on the command line, hands it the nonce key
and its listener sockets over a Unix socket pair (`stunnerd.workers.sockets.FdChannel`), and
talks to it with one message per line on its stdin and stdout (`stunnerd.workers.protocol`, the
records of `stunner_common.contracts.worker_messages`): each request carries an `id` that the
reply repeats, and every request has a deadline. A worker
that exits fails the requests still waiting on it and sets `exited`, which the pool's watchdog
waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import sys
from typing import Any, TypeVar

from stunner_common.contracts.worker_messages import (
    CloseRequest,
    ErrorReply,
    NonceKey,
    Reply,
    Request,
    WorkerMessageError,
    decode_reply,
)
from stunner_common.logs import LogFormat
from stunnerd.handoff.transport.journal import Journal
from stunnerd.net.guard import ClientLimits
from stunnerd.net.tuning import ServerTuning
from stunnerd.quota import QuotaSettings
from stunnerd.status import StatsSnapshot
from stunnerd.workers.protocol import MAX_LINE_BYTES, encode
from stunnerd.workers.sockets import FdChannel, new_nonce_key
from stunnerd.workers.timeouts import WorkerTimeouts

log = logging.getLogger(__name__)

DEFAULT_TUNING = ServerTuning()

R = TypeVar("R", bound=Reply)


DEFAULT_TIMEOUTS = WorkerTimeouts()


class WorkerError(Exception):
    """A worker did not answer, or answered with an error."""


class Worker:
    """One child process and the requests in flight to it."""

    def __init__(
        self,
        index: int,
        bind_host: str,
        log_spec: str | None,
        *,
        log_format: LogFormat = "text",
        tuning: ServerTuning = DEFAULT_TUNING,
        stop_timeout_s: float = 10.0,
        limits: ClientLimits | None = None,
        nonce_key: bytes | None = None,
        relay_addresses: tuple[str, ...] = (),
        quota: QuotaSettings | None = None,
        node_address: str = "",
        journal: bool = True,
        libbpf: str = "",
    ) -> None:
        self.index = index
        self.nonce_key = nonce_key
        self.channel: FdChannel | None = None
        self._argv = [
            sys.executable,
            "-m",
            "stunnerd.worker_main",
            "--index",
            str(index),
            "--bind",
            bind_host,
            *(["--log", log_spec] if log_spec else []),
            "--log-format",
            log_format,
            "--tuning",
            tuning.to_json(),
            *(["--limits", limits.to_json()] if limits is not None else []),
            *(["--relay-addresses", ",".join(relay_addresses)] if relay_addresses else []),
            *(["--quota", quota.to_worker_json()] if quota is not None else []),
            *(["--node-address", node_address] if node_address else []),
            *([] if journal else ["--no-journal"]),
            # The supervisor's libbpf (`STUNNERD_LIBBPF`), so that a worker reads no settings.
            *(["--libbpf", libbpf] if libbpf else []),
        ]
        self._stop_timeout_s = stop_timeout_s
        self.proc: asyncio.subprocess.Process | None = None
        self.offload: dict[str, Any] = {}  # its last reported offload status
        self.quota: dict[str, Any] | None = None  # its cluster-wide quota state, if any
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.stats = StatsSnapshot()
        self.exited = asyncio.Event()
        # Its TURN-UDP allocations as it journals them, kept across its restarts (`journal`).
        self.journal = Journal()
        self.owner = index + 1
        """The tag of the kernel offload entries this incarnation writes."""
        self.fresh = True
        """Started and not yet given a config: the next one carries its journaled allocations."""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> None:
        self.exited.clear()
        self.fresh = True
        self._close_channel()
        self.channel, theirs = FdChannel.pair()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self._argv,
                "--fd-channel",
                str(theirs.fileno()),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=MAX_LINE_BYTES,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        self.channel.send(NonceKey(self.nonce_key or new_nonce_key()))
        asyncio.get_running_loop().add_reader(
            self.channel.sock.fileno(), self.journal.read, self.channel
        )
        self._reader = asyncio.create_task(self._read(), name=f"stunnerd-worker-{self.index}")

    async def _read(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    message = decode_reply(line)
                except WorkerMessageError as exc:
                    log.warning("worker %d: unreadable reply %r: %s", self.index, line[:80], exc)
                    if exc.ident is None:
                        continue
                    message = ErrorReply(f"unreadable reply: {exc}", exc.ident)
                future = self._pending.pop(message.id, None)
                if future is not None and not future.done():
                    future.set_result(message)
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(WorkerError(f"worker {self.index} exited"))
            self._pending.clear()
            self.exited.set()

    async def request(self, message: Request, expect: type[R], timeout_s: float) -> R:
        """Send `message` and wait for its reply, which must be an `expect`; a worker's
        `ErrorReply`, another reply, no reply in time or a dead worker: WorkerError."""
        if self.proc is None or self.proc.stdin is None or self.exited.is_set():
            raise WorkerError(f"worker {self.index} is not running")
        ident = next(self._ids)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            self.proc.stdin.write(encode(dataclasses.replace(message, id=ident)))
            async with asyncio.timeout(timeout_s):
                await self.proc.stdin.drain()
                reply = await future
        except (TimeoutError, ConnectionError, RuntimeError) as exc:
            # uvloop raises RuntimeError when the pipe of a process that just died is closed
            raise WorkerError(f"worker {self.index}: {message.OP} failed: {exc!r}") from exc
        finally:
            self._pending.pop(ident, None)
        if isinstance(reply, ErrorReply):
            raise WorkerError(f"worker {self.index}: {message.OP}: {reply.error}")
        if not isinstance(reply, expect):
            raise WorkerError(f"worker {self.index}: {message.OP} answered {reply.OP}")
        return reply

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None and proc.stdin is not None and not proc.stdin.is_closing():
            # The process may have died a moment ago: its pipe can be closed under us (uvloop
            # then raises RuntimeError, asyncio a ConnectionError).
            with contextlib.suppress(ConnectionError, RuntimeError):
                proc.stdin.write(encode(CloseRequest()))
                proc.stdin.close()
        try:
            async with asyncio.timeout(self._stop_timeout_s):
                await proc.wait()
        except TimeoutError:
            log.warning("worker %d did not stop, killing pid %d", self.index, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self.proc = None
        self._close_channel()

    def _close_channel(self) -> None:
        """Close the socket channel, after reading what the worker journaled last."""
        channel, self.channel = self.channel, None
        if channel is None:
            return
        asyncio.get_running_loop().remove_reader(channel.sock.fileno())
        self.journal.read(channel)
        channel.close()
