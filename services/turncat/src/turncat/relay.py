"""The local side of the tunnel: accept local clients and give each its own TURN session.

A UDP client is a source address on the local socket; a TCP client is an accepted connection;
stdin/stdout is a single client. Each gets a fresh `TurnSession` (its own allocation and its own
credentials, as upstream turncat does). Datagrams that arrive while a UDP client's allocation is
being set up wait in a short queue. A TCP client's byte stream is relayed as it is read, one
datagram per read of at most 1500 bytes, and datagrams from the peer are written back to the
stream unframed, which is what upstream turncat does too. A UDP client that falls silent for
`client_idle_timeout_s` is deallocated. With a TCP peer (RFC 6062) a TCP client or stdin gets a
data connection of its own and bytes are spliced both ways as they are; when one side ends its
stream the other is half-closed and has `stdin_linger_s` of silence to finish. Every background
task is owned by the `Tunnel`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import stat
import sys
from collections.abc import Callable, Coroutine
from typing import Any, cast

from turncat.carrier import UDP_RCVBUF_BYTES
from turncat.errors import TurncatError, UnreachableError
from turncat.session import DataCallback, LostCallback, TurnSession
from turncat.settings import TurncatSettings
from turncat.uri import LocalAddress

log = logging.getLogger(__name__)

READ_BYTES = 1500
STREAM_READ_BYTES = 1 << 16
TCP_WRITE_LIMIT_BYTES = 1 << 20
FAILED_CLIENT_HOLDOFF_S = 5.0
CLOSE_SUFFIX = "-close"

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
        self._udp: _UdpClients | None = None
        self._server: asyncio.Server | None = None
        self.bound_address: tuple[str, int] | None = None

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
                    lambda: _UdpClients(self),
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
        reply = asyncio.Event()
        lost = asyncio.Event()
        stdout_gone = False
        out = sys.stdout.buffer

        def on_data(data: bytes) -> None:
            nonlocal stdout_gone
            try:
                out.write(data)
                out.flush()
            except OSError as exc:  # stdout closed under us: nobody is reading any more
                log.info("stdout closed: %s", exc)
                stdout_gone = True
                lost.set()
                return
            reply.set()

        why: list[str] = []

        def on_lost(exc: Exception | None) -> None:
            why.append(str(exc) if exc else "closed by the server")
            lost.set()

        session = self.new_session("stdio", on_data, on_lost)
        lost_waiter = asyncio.create_task(lost.wait(), name="stdio-lost")
        try:
            await session.open()
            read = await _stdin_reader()
            if session.peer_transport == "tcp":
                await _stdio_stream(session, read, out, lost, self._settings.stdin_linger_s)
                return
            while not lost.is_set():
                reading = asyncio.create_task(read(), name="stdio-read")
                await asyncio.wait({reading, lost_waiter}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    reading.cancel()
                    await asyncio.gather(reading, return_exceptions=True)
                    break
                data = reading.result()
                if not data:
                    break
                session.send(data)
            while not lost.is_set():
                reply.clear()
                try:
                    async with asyncio.timeout(self._settings.stdin_linger_s):
                        await reply.wait()
                except TimeoutError:
                    break
        finally:
            lost_waiter.cancel()
            await asyncio.gather(lost_waiter, return_exceptions=True)
            await self.end_session(session)
        if lost.is_set() and not stdout_gone:
            raise UnreachableError(f"the TURN session was lost: {why[0] if why else 'unknown'}")


async def _stdio_stream(
    session: TurnSession,
    read: Callable[[], Coroutine[Any, Any, bytes]],
    out: Any,
    lost: asyncio.Event,
    linger_s: float,
) -> None:
    """stdin to a TCP peer and its bytes to stdout, over one RFC 6062 data connection."""
    peer_reader, peer_writer = await session.connect()
    flow = _Flow()

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


async def splice(
    local: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    peer: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    lost: asyncio.Event,
    linger_s: float,
) -> None:
    """Copy bytes both ways between a local TCP client and a data connection until both ends
    are done, the TURN session is lost, or one end finished and the other fell silent."""
    flow = _Flow()

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


class _Flow:
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


async def _stdin_reader() -> Callable[[], Coroutine[Any, Any, bytes]]:
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


class _UdpLink:
    """One UDP local client: its address, session, pending queue and idle timer."""

    __slots__ = ("addr", "checked", "failed", "idle_handle", "packets", "pending", "session")

    def __init__(self, addr: tuple[str, int], queue_len: int) -> None:
        self.addr = addr
        self.session: TurnSession | None = None
        self.pending: collections.deque[bytes] | None = collections.deque(maxlen=queue_len)
        self.packets = 0
        self.checked = 0
        self.idle_handle: asyncio.TimerHandle | None = None
        self.failed = False


class _UdpClients(asyncio.DatagramProtocol):
    """The shared local UDP socket: demultiplexes datagrams by source address."""

    def __init__(self, tunnel: Tunnel) -> None:
        self._tunnel = tunnel
        self._settings = tunnel._settings
        self._links: dict[tuple[str, int], _UdpLink] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self._loop = asyncio.get_running_loop()
        self._stopped = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Room for bursts from many local clients while the loop is busy relaying.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RCVBUF_BYTES)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        link = self._links.get(addr)
        if link is None:
            if self._stopped:
                return
            link = _UdpLink(addr, self._settings.pending_datagrams)
            self._links[addr] = link
            self._tunnel.spawn(self._open(link), name=f"udp:{addr[0]}:{addr[1]}-open")
        else:
            if link.failed:
                return
            link.packets += 1
        if link.pending is not None:
            link.pending.append(data)
        else:
            link.session.send(data)  # type: ignore[union-attr]

    async def _open(self, link: _UdpLink) -> None:
        addr = link.addr
        name = f"udp:{addr[0]}:{addr[1]}"
        transport = self._transport
        assert transport is not None

        def on_data(data: bytes) -> None:
            transport.sendto(data, addr)

        def on_lost(exc: Exception | None) -> None:
            self._drop(link, "relay lost")

        session = self._tunnel.new_session(name, on_data, on_lost)
        link.session = session
        try:
            await session.open()
        except TurncatError as exc:
            # Hold the address off for a while so a client that keeps sending does not make
            # us hammer the server with allocations that fail the same way.
            log.warning("%s: dropping client for %g s: %s", name, FAILED_CLIENT_HOLDOFF_S, exc)
            link.failed = True
            link.pending = None
            link.idle_handle = self._loop.call_later(FAILED_CLIENT_HOLDOFF_S, self._forget, link)
            await self._tunnel.end_session(session)
            return
        log.info("%s: new client", name)
        pending, link.pending = link.pending, None
        for data in pending or ():
            session.send(data)
        self._arm_idle(link)

    def _forget(self, link: _UdpLink) -> None:
        if self._links.get(link.addr) is link:
            del self._links[link.addr]

    def _arm_idle(self, link: _UdpLink) -> None:
        # A packet counter instead of a timestamp keeps the clock off the per-datagram path; a
        # client is dropped after one to two idle periods of silence.
        link.checked = link.packets
        link.idle_handle = self._loop.call_later(
            self._settings.client_idle_timeout_s, self._check_idle, link
        )

    def _check_idle(self, link: _UdpLink) -> None:
        if self._links.get(link.addr) is not link:
            return
        if link.packets == link.checked:
            self._drop(link, "idle")
        else:
            self._arm_idle(link)

    def _drop(self, link: _UdpLink, why: str) -> None:
        if self._links.get(link.addr) is link:
            del self._links[link.addr]
        if link.idle_handle is not None:
            link.idle_handle.cancel()
        if link.session is not None:
            log.info("udp:%s:%s: client %s, deallocating", link.addr[0], link.addr[1], why)
            name = f"udp:{link.addr[0]}:{link.addr[1]}{CLOSE_SUFFIX}"
            self._tunnel.spawn(self._tunnel.end_session(link.session), name=name)

    def stop(self) -> None:
        self._stopped = True
        for link in list(self._links.values()):
            if link.idle_handle is not None:
                link.idle_handle.cancel()
        self._links.clear()
        if self._transport is not None:
            self._transport.close()

    def error_received(self, exc: Exception) -> None:
        log.debug("local UDP socket: %s", exc)
