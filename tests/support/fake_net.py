"""A fake event loop, transports and sockets for the unit tests of stunnerd's network edge.

In uvicorn's style: the protocol objects under test are the real ones; what they talk to records
what it is asked to do. `MockLoop` stands in for the event loop a listener is given: its clock
moves only when a test calls `advance`, which fires the timers that fall due (an idle timeout of
60 s is tested without waiting), `call_soon` callbacks wait for `run_ready`, and tasks are
coroutines stepped by hand, which must finish without waiting on anything real. `MockTransport`
(TCP/TLS) records `write` and `close`; `MockDatagramTransport` records `sendto`; `FakeSocket`
stands in for the raw sockets that the send batcher and the relays write to. Closing a fake
transport tells its protocol (`connection_lost`) on the loop's next `run_ready`, as asyncio does.
"""

from __future__ import annotations

import itertools
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import Any

Address = tuple[str, int]

_fds = itertools.count(1000)


class MockTimerHandle:
    """A `call_at` handle: fired by `MockLoop.advance` unless cancelled."""

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class MockTask:
    """A task of the fake loop: a coroutine stepped by `MockLoop.run_ready`."""

    def __init__(self, coro: Coroutine[Any, Any, Any], name: str | None) -> None:
        self.coro = coro
        self.name = name or "task"
        self._callbacks: list[Callable[[MockTask], Any]] = []
        self._done = False
        self._cancelled = False

    def get_name(self) -> str:
        return self.name

    def add_done_callback(self, callback: Callable[[MockTask], Any]) -> None:
        self._callbacks.append(callback)

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> bool:
        if self._done:
            return False
        self.coro.close()
        self._cancelled = True
        self._finish()
        return True

    def step(self) -> None:
        """Run the coroutine to its end; it may not wait on anything the fake loop cannot run."""
        if self._done:
            return
        try:
            awaited = self.coro.send(None)
        except StopIteration:
            self._finish()
            return
        self.coro.close()
        raise AssertionError(f"task {self.name} awaited {awaited!r}, which MockLoop cannot run")

    def _finish(self) -> None:
        self._done = True
        for callback in self._callbacks:
            callback(self)


class MockLoop:
    """The parts of an event loop that a listener uses, with a clock that tests move."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.timers: list[MockTimerHandle] = []
        self.ready: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.tasks: list[MockTask] = []
        self.endpoints: list[tuple[MockDatagramTransport, Any]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> MockTimerHandle:
        handle = MockTimerHandle(when, callback, args)
        self.timers.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> MockTimerHandle:
        return self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        self.ready.append((callback, args))

    def create_task(self, coro: Coroutine[Any, Any, Any], *, name: str | None = None) -> MockTask:
        task = MockTask(coro, name)
        self.tasks.append(task)
        self.call_soon(task.step)
        return task

    async def create_datagram_endpoint(
        self, factory: Callable[[], Any], sock: Any = None, **_kw: Any
    ) -> tuple[MockDatagramTransport, Any]:
        protocol = factory()
        transport = MockDatagramTransport(sock, protocol)
        protocol.connection_made(transport)
        self.endpoints.append((transport, protocol))
        return transport, protocol

    # ------------------------------------------------------------------ driving it

    def run_ready(self) -> None:
        """Run the `call_soon` callbacks and tasks, and those they schedule, until none is left."""
        while self.ready:
            callback, args = self.ready.pop(0)
            callback(*args)

    def pending(self) -> list[MockTimerHandle]:
        """The timers still armed, soonest first."""
        return sorted((h for h in self.timers if not h.cancelled), key=lambda h: h.when)

    def advance(self, seconds: float) -> None:
        """Move the clock, firing every timer that falls due on the way, in order."""
        target = self.now + seconds
        while True:
            self.run_ready()
            due = [h for h in self.pending() if h.when <= target]
            if not due:
                break
            handle = due[0]
            self.timers.remove(handle)
            self.now = max(self.now, handle.when)
            handle.callback(*handle.args)
        self.now = target
        self.run_ready()


class FakeSocket:
    """A raw UDP socket that records what is sent on it; closed, it fails as a real one does."""

    def __init__(
        self, sockname: Address = ("127.0.0.1", 40000), family: int = socket.AF_INET
    ) -> None:
        self.sockname = sockname
        self.family = family
        self.sent: list[tuple[bytes, Any]] = []
        self.segmented: list[tuple[bytes, int, Any]] = []  # (buffer, segment size, address)
        self.closed = False
        self.fail_with: OSError | None = None  # raised by the next sends, when set
        self._fd = next(_fds)

    def sendto(self, data: bytes, addr: Any) -> int:
        self._check()
        self.sent.append((bytes(data), addr))
        return len(data)

    def sendmsg(self, buffers: list[bytes], ancdata: list[Any], flags: int, addr: Any) -> int:
        self._check()
        data = b"".join(buffers)
        size = int.from_bytes(ancdata[0][2], sys.byteorder) if ancdata else len(data)
        self.segmented.append((data, size, addr))
        return len(data)

    def _check(self) -> None:
        if self.closed:
            raise OSError(9, "Bad file descriptor")
        if self.fail_with is not None:
            raise self.fail_with

    def getsockname(self) -> Address:
        return self.sockname

    def fileno(self) -> int:
        return -1 if self.closed else self._fd

    def setblocking(self, flag: bool) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def payloads(self) -> list[bytes]:
        """Every datagram sent, a GSO buffer split back into its segments."""
        out = [data for data, _ in self.sent]
        for data, size, _ in self.segmented:
            out.extend(data[i : i + size] for i in range(0, len(data), size))
        return out


class MockDatagramTransport:
    """A datagram transport over a (fake) socket: records `sendto` and `close`."""

    def __init__(self, sock: Any = None, protocol: Any = None) -> None:
        self.sock = sock
        self.protocol = protocol
        self.sent: list[tuple[bytes, Any]] = []
        self.closed = False

    def sendto(self, data: bytes, addr: Any = None) -> None:
        assert not self.closed, "sendto on a closed transport"
        self.sent.append((bytes(data), addr))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.sock is not None:
            self.sock.close()
        if self.protocol is not None:
            self.protocol.connection_lost(None)

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname" and self.sock is not None:
            return self.sock.getsockname()
        if name == "socket":
            return self.sock
        return default


class MockTransport:
    """A TCP/TLS transport: records `write`, `close` and `abort`; tells the protocol it is lost
    on the loop's next `run_ready` (once, however often it is closed)."""

    def __init__(self, loop: MockLoop, peername: Address = ("192.0.2.10", 40000)) -> None:
        self.loop = loop
        self.peername = peername
        self.protocol: Any = None
        self.written: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.close_calls = 0
        self.reading = True

    def attach(self, protocol: Any) -> MockTransport:
        """Connect `protocol` to this transport (`connection_made`)."""
        self.protocol = protocol
        protocol.connection_made(self)
        return self

    def write(self, data: bytes) -> None:
        assert not self.closed, "write on a closed transport"
        self.written.append(bytes(data))

    def data(self) -> bytes:
        return b"".join(self.written)

    def close(self) -> None:
        self.close_calls += 1
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                self.loop.call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.aborted = True
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.peername
        return default
