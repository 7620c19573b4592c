"""The local side of the tunnel: accept local clients and give each its own TURN session.

A UDP client is a source address on the local socket (`turncat.udp_clients`); a TCP client is an
accepted connection; stdin/stdout is a single client. Each gets a fresh `TurnSession` (its own
allocation and its own credentials, as upstream turncat does). A TCP client's byte stream is
relayed as it is read, one datagram per read of at most 1500 bytes, and datagrams from the peer
are written back to the stream unframed, which is what upstream turncat does too. With a TCP
peer (RFC 6062) a TCP client or stdin gets a data connection of its own, spliced both ways by
`turncat.streams`. Every background task is owned by the `Tunnel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any, BinaryIO

from turncat.errors import TurncatError, UnreachableError
from turncat.session import DataCallback, LostCallback, TurnSession
from turncat.settings import TurncatSettings
from turncat.streams import READ_BYTES, Reader, splice, stdin_reader, stdio_stream
from turncat.udp_clients import CLOSE_SUFFIX, UdpClients
from turncat.uri import LocalAddress

log = logging.getLogger(__name__)

TCP_WRITE_LIMIT_BYTES = 1 << 20

SessionFactory = Callable[[str, DataCallback, LostCallback], TurnSession]


class Tunnel:
    """Runs the local listener and owns every client's session and task."""

    def __init__(
        self, local: LocalAddress, factory: SessionFactory, settings: TurncatSettings
    ) -> None:
        self._local = local
        self._factory = factory
        self._settings = settings
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sessions: set[TurnSession] = set()
        self._udp: UdpClients | None = None
        self._server: asyncio.Server | None = None
        self.bound_address: tuple[str, int] | None = None

    @property
    def settings(self) -> TurncatSettings:
        return self._settings

    # -- task ownership --------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    def new_session(self, name: str, on_data: DataCallback, on_lost: LostCallback) -> TurnSession:
        session = self._factory(name, on_data, on_lost)
        self._sessions.add(session)
        return session

    async def end_session(self, session: TurnSession) -> None:
        self._sessions.discard(session)
        await session.close()

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    # -- modes -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the local UDP socket or TCP listener (not used in stdio mode)."""
        loop = asyncio.get_running_loop()
        local = self._local
        try:
            if local.kind == "udp":
                transport, udp = await loop.create_datagram_endpoint(
                    lambda: UdpClients(self),
                    local_addr=(local.host, local.port),
                    reuse_port=False,
                )
                self._udp = udp
                self.bound_address = transport.get_extra_info("sockname")[:2]
            elif local.kind == "tcp":
                self._server = await asyncio.start_server(
                    self._tcp_client, local.host, local.port, reuse_address=True
                )
                self.bound_address = self._server.sockets[0].getsockname()[:2]
        except OSError as exc:
            raise TurncatError(
                f"cannot listen on {local.kind}://{local.host}:{local.port}: {exc}"
            ) from None
        log.info("listening on %s://%s:%s", local.kind, *(self.bound_address or ("-", "-")))

    async def aclose(self) -> None:
        """Stop accepting, deallocate every session concurrently (each one is bounded in time),
        then cancel what is still running."""
        if self._udp is not None:
            self._udp.stop()
        if self._server is not None:
            self._server.close()
        sessions = list(self._sessions)
        self._sessions.clear()
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        for task in list(self._tasks):
            if not task.get_name().endswith(CLOSE_SUFFIX):
                task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    # -- TCP -------------------------------------------------------------------------------

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio runs this callback as its own task; register it so shutdown can cancel it.
        me = asyncio.current_task()
        if me is not None:
            self._tasks.add(me)
            me.add_done_callback(self._task_done)
        addr = writer.get_extra_info("peername")
        name = f"tcp:{addr[0]}:{addr[1]}"
        lost = asyncio.Event()

        def on_data(data: bytes) -> None:
            # A client that does not read loses datagrams instead of growing our buffer.
            if not writer.is_closing() and (
                writer.transport.get_write_buffer_size() < TCP_WRITE_LIMIT_BYTES
            ):
                writer.write(data)

        def on_lost(exc: Exception | None) -> None:
            lost.set()
            writer.close()

        session = self.new_session(name, on_data, on_lost)
        try:
            await session.open()
            log.info("%s: new client", name)
            if session.peer_transport == "tcp":
                peer_reader, peer_writer = await session.connect()
                await splice(
                    (reader, writer),
                    (peer_reader, peer_writer),
                    lost,
                    self._settings.stdin_linger_s,
                )
                return
            while not lost.is_set():
                data = await reader.read(READ_BYTES)
                if not data:
                    break
                session.send(data)
        except TurncatError as exc:
            log.warning("%s: dropping client: %s", name, exc)
        except OSError as exc:
            log.debug("%s: client connection error: %s", name, exc)
        finally:
            await self.end_session(session)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()
            log.info("%s: client gone", name)

    # -- stdio -----------------------------------------------------------------------------

    async def run_stdio(self) -> None:
        """Relay stdin to the peer and the peer's datagrams to stdout until stdin ends.

        The session is opened first, so its errors (auth, 403, unreachable) end the program.
        After end of input, replies are still printed until the peer is quiet for
        `stdin_linger_s`.
        """
        stdio = _Stdio(sys.stdout.buffer)
        linger_s = self._settings.stdin_linger_s
        session = self.new_session("stdio", stdio.on_data, stdio.on_lost)
        lost_waiter = asyncio.create_task(stdio.lost.wait(), name="stdio-lost")
        try:
            await session.open()
            read = await stdin_reader()
            if session.peer_transport == "tcp":
                await stdio_stream(await session.connect(), read, stdio.out, stdio.lost, linger_s)
                return
            await _send_stdin(session, read, stdio.lost, lost_waiter)
            await stdio.linger(linger_s)
        finally:
            lost_waiter.cancel()
            await asyncio.gather(lost_waiter, return_exceptions=True)
            await self.end_session(session)
        stdio.raise_if_lost()


async def _send_stdin(
    session: TurnSession, read: Reader, lost: asyncio.Event, lost_waiter: asyncio.Task[Any]
) -> None:
    """stdin to the peer, one datagram per read, until end of input or the session is lost."""
    while not lost.is_set():
        reading = asyncio.create_task(read(), name="stdio-read")
        await asyncio.wait({reading, lost_waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not reading.done():
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            return
        data = reading.result()
        if not data:
            return
        session.send(data)


class _Stdio:
    """stdout as the one local client: the peer's datagrams go there until it is closed."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.reply = asyncio.Event()
        self.lost = asyncio.Event()
        self.stdout_gone = False
        self.why: list[str] = []

    def on_data(self, data: bytes) -> None:
        try:
            self.out.write(data)
            self.out.flush()
        except OSError as exc:  # stdout closed under us: nobody is reading any more
            log.info("stdout closed: %s", exc)
            self.stdout_gone = True
            self.lost.set()
            return
        self.reply.set()

    def on_lost(self, exc: Exception | None) -> None:
        self.why.append(str(exc) if exc else "closed by the server")
        self.lost.set()

    async def linger(self, linger_s: float) -> None:
        """After end of input: go on until the peer is quiet for `linger_s` (or is lost)."""
        while not self.lost.is_set():
            self.reply.clear()
            try:
                async with asyncio.timeout(linger_s):
                    await self.reply.wait()
            except TimeoutError:
                return

    def raise_if_lost(self) -> None:
        if self.lost.is_set() and not self.stdout_gone:
            why = self.why[0] if self.why else "unknown"
            raise UnreachableError(f"the TURN session was lost: {why}")
