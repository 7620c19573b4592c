"""The handoff socket: a new stunnerd takes a running one's sockets and allocation state.

The running stunnerd listens on a Unix stream socket (`HandoffServer`) in a directory only its
user may write: one it creates with mode 0700, or an existing one owned by that user and not
writable by others; anything else is refused before a socket is bound. A peer is served only if
its credentials (SO_PEERCRED) carry this process's uid, and the new process checks the same of
the one it connects to. A refused peer is logged and changes nothing.

The conversation, one length-prefixed JSON message at a time (fds ride SCM_RIGHTS, at most
`FDS_PER_MESSAGE` per message, after the message that counts them):

1. new → old: ``{"op": "hello", "readable": [1], "named": true}``, the state versions it reads
   and whether it takes named sockets too;
2. old → new: ``{"op": "refused", "reason": …}``, or ``{"op": "offer", "version": V,
   "state_bytes": N, "fds": K, "named": [[name, host, port], …]}``, then the state document,
   then the K fds, the last ones the named sockets (the health and metrics listening sockets,
   sent only to a process that said `named`: an older one reads the offer as before);
3. new → old: ``{"op": "serving"}`` once it serves on them: the old process lets go; or
   ``{"op": "refused", "reason": …}`` (a version it cannot read after all, a socket it cannot
   use): the old process goes on serving, as it does when the connection breaks first.

The old side pauses its traffic while it prepares an offer (the `HandoffSource` it is given
does that), so what the state says is what the sockets hold when the new one takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stunnerd.handoff.transport.named import NamedSocket

log = logging.getLogger(__name__)

FDS_PER_MESSAGE = 250
"""Below the kernel's SCM_MAX_FD (253)."""
MAX_MESSAGE_BYTES = 1 << 20
HANDOFF_TIMEOUT_S = 10.0
"""How long one step of the conversation may take before the old process resumes."""
_LENGTH = struct.Struct("!I")
_CREDENTIALS = struct.Struct("3i")


class HandoffError(RuntimeError):
    """The handoff could not be made (one line for the log or the user)."""


class HandoffRefusedError(HandoffError):
    """The other side refused: its reason is the message."""


@dataclass
class Offer:
    """What the old side hands over: the state document and the fds it names, in order.

    `resume` runs when the handoff fails after the offer was prepared (traffic goes on here);
    `release` when the new side serves (this side lets go of what it handed over).
    """

    document: bytes
    version: int
    fds: list[int]
    resume: Callable[[], Awaitable[None]]
    release: Callable[[], Awaitable[None]]


class HandoffSource(Protocol):
    async def prepare(self, readable: Sequence[int]) -> Offer:
        """Pause, snapshot and offer; raise HandoffRefusedError to refuse (nothing paused)."""


def private_directory(path: Path) -> None:
    """Make sure `path` is a directory that only this user may write, creating it if absent."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise HandoffError(f"cannot make the handoff directory {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise HandoffError(f"the handoff directory {path} is not a directory")
    if info.st_uid != os.getuid():
        raise HandoffError(f"the handoff directory {path} belongs to uid {info.st_uid}, not us")
    if info.st_mode & 0o022:
        raise HandoffError(f"the handoff directory {path} is writable by others: refused")


def peer_uid(sock: socket.socket) -> int:
    _pid, uid, _gid = _CREDENTIALS.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    )
    return int(uid)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise HandoffError("the other side closed the handoff socket")
        chunks += chunk
    return bytes(chunks)


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(_LENGTH.pack(len(data)) + data)


def receive_message(sock: socket.socket) -> dict[str, Any]:
    (size,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    if size > MAX_MESSAGE_BYTES:
        raise HandoffError(f"a handoff message of {size} bytes is too large")
    try:
        message = json.loads(_recv_exact(sock, size))
    except ValueError:
        raise HandoffError("a handoff message is not JSON") from None
    if not isinstance(message, dict):
        raise HandoffError("a handoff message is not an object")
    return message


def send_fds(sock: socket.socket, fds: Sequence[int]) -> None:
    for start in range(0, len(fds), FDS_PER_MESSAGE):
        batch = list(fds[start : start + FDS_PER_MESSAGE])
        socket.send_fds(sock, [b"F"], batch)


def receive_fds(sock: socket.socket, count: int) -> list[int]:
    fds: list[int] = []
    try:
        while len(fds) < count:
            want = min(FDS_PER_MESSAGE, count - len(fds))
            data, got, _flags, _addr = socket.recv_fds(sock, 1, want)
            fds.extend(got)
            if not data:
                raise HandoffError("the other side closed the handoff socket")
            if len(got) != want:
                raise HandoffError(f"expected {want} fds in one message, got {len(got)}")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


@dataclass
class HandoffServer:
    """The running stunnerd's end: serves one handoff at a time to a process of its own user."""

    path: Path
    source: HandoffSource
    timeout_s: float = HANDOFF_TIMEOUT_S
    handed_over: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a new process serves on what was handed over: this one should exit."""
    refused_peers: int = 0
    named: Callable[[], Sequence[NamedSocket]] | None = None
    """The listening sockets handed over beside the state to a process that takes them."""
    _sock: socket.socket | None = None
    _busy: bool = False
    _inode: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        private_directory(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a live one was asked first (see `find_live`); this is stale
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, 0o600)
            sock.listen(4)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._inode = self.path.stat().st_ino
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept)
        log.info("handoff socket listening at %s", self.path)

    def _accept(self) -> None:
        assert self._sock is not None
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        uid = peer_uid(conn)
        if uid != os.getuid():
            self.refused_peers += 1
            log.warning("handoff: refused a peer of uid %d (only uid %d may)", uid, os.getuid())
            conn.close()
            return
        if self._busy:
            log.warning("handoff: refused a second peer while one handoff runs")
            conn.close()
            return
        self._busy = True
        task = asyncio.get_running_loop().create_task(self._serve(conn), name="handoff")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        conn.settimeout(self.timeout_s)
        offer: Offer | None = None
        try:
            hello = await asyncio.to_thread(receive_message, conn)
            readable = [v for v in hello.get("readable") or [] if isinstance(v, int)]
            if hello.get("op") != "hello":
                raise HandoffError(f"expected hello, got {hello.get('op')!r}")
            try:
                offer = await self.source.prepare(readable)
            except HandoffRefusedError as exc:
                await asyncio.to_thread(send_message, conn, {"op": "refused", "reason": str(exc)})
                log.warning("handoff refused: %s", exc)
                return
            named = list(self.named()) if hello.get("named") and self.named is not None else []
            await asyncio.to_thread(self._send_offer, conn, offer, named)
            answer = await asyncio.to_thread(receive_message, conn)
            if answer.get("op") != "serving":
                raise HandoffRefusedError(str(answer.get("reason") or answer))
        except (OSError, HandoffError) as exc:
            log.warning("handoff failed, serving on: %s", exc)
            if offer is not None:
                await offer.resume()
            return
        finally:
            self._busy = False
            conn.close()
        assert offer is not None  # the try returned on every other path
        log.info("handoff: the new process serves; letting go")
        await offer.release()
        self.handed_over.set()

    @staticmethod
    def _send_offer(conn: socket.socket, offer: Offer, named: Sequence[NamedSocket]) -> None:
        send_message(
            conn,
            {
                "op": "offer",
                "version": offer.version,
                "state_bytes": len(offer.document),
                "fds": len(offer.fds) + len(named),
                "named": [[n.name, n.host, n.port] for n in named],
            },
        )
        conn.sendall(offer.document)
        send_fds(conn, [*offer.fds, *(n.sock.fileno() for n in named)])

    async def close(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            # The process that took over may listen at the same path by now: leave its socket.
            with contextlib.suppress(FileNotFoundError):
                if self.path.stat().st_ino == self._inode:
                    self.path.unlink()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class Received:
    """What the new side took: the document and the fds, and the socket to answer on."""

    version: int
    document: bytes
    fds: list[int]
    conn: socket.socket
    named: list[NamedSocket] = field(default_factory=list)
    """The listening sockets handed over beside the state (this side owns them)."""

    def confirm(self) -> None:
        """Tell the old process that this one serves: it lets go and exits."""
        try:
            send_message(self.conn, {"op": "serving"})
        finally:
            self.conn.close()

    def refuse(self, reason: str) -> None:
        """Give everything back: the old process goes on serving."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        for named in self.named:
            named.sock.close()
        self.named = []
        with contextlib.suppress(OSError):
            send_message(self.conn, {"op": "refused", "reason": reason})
        self.conn.close()


def find_live(path: Path) -> socket.socket | None:
    """A connection to a live stunnerd's handoff socket at `path`, or None when none answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise HandoffError(f"cannot reach the handoff socket {path}: {exc.strerror}") from None
    return sock


def take_over(
    path: Path, readable: Sequence[int], timeout_s: float = HANDOFF_TIMEOUT_S
) -> Received | None:
    """Ask the stunnerd at `path` for its sockets and state (blocking); None when none runs.

    Raises HandoffRefusedError when it refuses (it goes on serving), HandoffError otherwise.
    """
    private_directory(path.parent)
    conn = find_live(path)
    if conn is None:
        return None
    try:
        conn.settimeout(timeout_s)
        uid = peer_uid(conn)
        if uid != os.getuid():
            raise HandoffError(f"the handoff socket {path} is served by uid {uid}, not us")
        send_message(conn, {"op": "hello", "readable": sorted(readable), "named": True})
        offer = receive_message(conn)
        if offer.get("op") == "refused":
            raise HandoffRefusedError(str(offer.get("reason") or "refused"))
        if offer.get("op") != "offer":
            raise HandoffError(f"expected an offer, got {offer.get('op')!r}")
        size, count, version = offer.get("state_bytes"), offer.get("fds"), offer.get("version")
        if not (isinstance(size, int) and isinstance(count, int) and isinstance(version, int)):
            raise HandoffError("an offer without state_bytes, fds or version")
        names = _named_records(offer.get("named"), count)
        document = _recv_exact(conn, size)
        fds = receive_fds(conn, count)
    except BaseException:
        conn.close()
        raise
    state_fds = fds[: count - len(names)]
    named = [
        NamedSocket(name, host, port, socket.socket(fileno=fd))
        for (name, host, port), fd in zip(names, fds[len(state_fds) :], strict=True)
    ]
    return Received(version, document, state_fds, conn, named)


def _named_records(value: Any, count: int) -> list[tuple[str, str, int]]:
    """The offer's `named` entries, checked (none from an older stunnerd)."""
    if value is None:
        return []
    out: list[tuple[str, str, int]] = []
    for item in value if isinstance(value, list) else [value]:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[1], str)
            and isinstance(item[2], int)
        ):
            raise HandoffError(f"an offer with a bad named socket {item!r}")
        out.append((item[0], item[1], item[2]))
    if len(out) > count:
        raise HandoffError(f"an offer naming {len(out)} sockets of {count} fds")
    return out
