"""A worker's allocations, kept by the supervisor so that they outlive the worker.

A worker journals every TURN-UDP allocation over its socket channel (`Channel`: the worker's
`stunnerd.workers.sockets.FdChannel`) whenever the allocation changes (`JournalWriter`, which
`records.RecordJournal` makes the `stunnerd.net.ports.AllocationJournal` of a worker): an entry
(`contracts.worker_messages.JournalEntry`; `JournalDelete` when it is gone) is the allocation's
handoff record (`state.AllocationRecord`) as JSON (`records.record_json`) with the monotonic
time it was taken at, and for a new allocation the duplicates of its relay sockets (SCM_RIGHTS).
The changes of one turn of the worker's event loop travel as one `JournalBatch`, a binary frame
in which each record is carried as it is, not escaped again. The supervisor reads them as they
come (`Journal.read`), keeps each record's bytes undecoded and holds the sockets until the entry
is deleted. When the worker dies, its replacement is given the live entries as a handoff
document, their lifetimes counted down by the time that passed, and the sockets beside it
(`handover`): the new worker adopts them before it reads its listener socket, so the clients
carry on. In a handoff between two multi-process stunnerds, the old supervisor offers what its
workers' journals hold (`stunnerd.handoff.pool`).

The cost, per allocation: a few hundred bytes of a message per change (`python -m bench
restart` measures it) and, in the supervisor, one tuple of bytes and numbers and one fd
(`python -m bench journal`: the CPU of each side per allocation).
"""

from __future__ import annotations

import array
import errno
import fcntl
import json
import logging
import os
import socket
import termios
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from stunner_common.contracts.worker_messages import (
    JOURNAL_HEAD_BYTES,
    JOURNAL_ITEM_BYTES,
    MAX_CHANNEL_FDS,
    MAX_CHANNEL_MESSAGE_BYTES,
    JournalChange,
    WorkerMessageError,
    journal_delete,
    journal_message,
    journal_set,
    read_journal,
)
from stunnerd.handoff.transport.state import (
    FORMAT,
    VERSION,
    Address,
    HandoffFormatError,
    read_allocation,
)

log = logging.getLogger(__name__)

BATCH_BYTES = MAX_CHANNEL_MESSAGE_BYTES
"""What a batch may take, all told: the channel's message size."""
_NAMES_KEPT = 64
"""Listener names the writer keeps as UTF-8 (more only after many config changes)."""


class Channel(Protocol):
    """The Unix socket between a worker and its supervisor (SOCK_SEQPACKET, the contract's
    channel messages, some carrying fds): `stunnerd.workers.sockets.FdChannel`."""

    @property
    def sock(self) -> socket.socket: ...

    def send_bytes(self, data: bytes, fds: Sequence[int]) -> int:
        """One encoded message with its fds (duplicated into the peer); the bytes it took."""
        ...


class JournalWriter:
    """The worker's side: each change of an allocation, sent to the supervisor in the turn of
    its event loop.

    With `schedule` (the loop's `call_soon`), the changes of a turn are queued and go as one
    batch once the turn's callbacks have run (or sooner, when a batch is full); the worker calls
    `flush` before it answers its supervisor, so that what it did before an answer is journaled
    before the supervisor reads the answer. Without `schedule`, each change goes at once. A
    queued entry holds duplicates of its relay sockets until it is sent: the allocation may
    close its own meanwhile. A worker killed before the end of the turn that made an allocation
    loses that allocation with it (its client's next request gets 437, and it allocates again).
    """

    def __init__(
        self, channel: Channel, schedule: Callable[[Callable[[], None]], object] | None = None
    ) -> None:
        self.channel = channel
        self.schedule = schedule
        self.sent = 0  # messages
        self.sent_bytes = 0
        self._items: list[bytes] = []  # encoded (`journal_set`, `journal_delete`)
        self._fds: list[int] = []
        self._bytes = JOURNAL_HEAD_BYTES
        self._scheduled = False
        self._names: dict[str, bytes] = {}

    def _name(self, listener: str) -> bytes:
        if len(self._names) >= _NAMES_KEPT:
            self._names.clear()
        name = self._names[listener] = listener.encode()
        return name

    def changed(self, listener: str, client: Address, record: bytes, fds: Sequence[int]) -> None:
        """Journal `client`'s allocation as its record's JSON `record` (`records.record_json`;
        with its relay sockets' `fds` when it is new). A record too large for a channel message
        (thousands of permissions) is refused with OSError (EMSGSIZE)."""
        name = self._names.get(listener) or self._name(listener)
        host = client[0].encode()
        size = JOURNAL_ITEM_BYTES + len(name) + len(host) + len(record)
        if size > BATCH_BYTES - JOURNAL_HEAD_BYTES:
            raise OSError(
                errno.EMSGSIZE, f"an allocation record of {len(record)} bytes is too large"
            )
        if self._bytes + size > BATCH_BYTES or len(self._fds) + len(fds) > MAX_CHANNEL_FDS:
            self.flush()
        dups: list[int] = []
        try:
            for fd in fds:
                dups.append(os.dup(fd))
            item = journal_set(name, host, client[1], time.monotonic(), len(dups), record)
        except (OSError, WorkerMessageError) as exc:  # out of fds: not journaled (the caller logs)
            _close(dups)
            if isinstance(exc, OSError):
                raise
            raise OSError(errno.EINVAL, str(exc)) from None
        self._items.append(item)
        self._fds += dups
        self._bytes += size
        if not self._scheduled:
            self._queued()

    def deleted(self, listener: str, client: Address) -> None:
        name = self._names.get(listener) or self._name(listener)
        try:
            item = journal_delete(name, client[0].encode(), client[1])
        except WorkerMessageError as exc:
            raise OSError(errno.EINVAL, str(exc)) from None
        if self._bytes + len(item) > BATCH_BYTES:
            self.flush()
        self._items.append(item)
        self._bytes += len(item)
        if not self._scheduled:
            self._queued()

    def _queued(self) -> None:
        """The first change of a turn: send it at once without a loop, else at the turn's end."""
        if self.schedule is None:
            self.flush()
        else:
            self._scheduled = True
            self.schedule(self.flush)

    def flush(self) -> None:
        """Send what is queued. A batch the channel refuses is logged and left out: those
        allocations are not carried across a crash of this worker; it serves them on."""
        self._scheduled = False
        items, fds = self._items, self._fds
        if not items:
            return
        self._items, self._fds, self._bytes = [], [], JOURNAL_HEAD_BYTES
        try:
            self.sent_bytes += self.channel.send_bytes(journal_message(items), fds)
            self.sent += 1
        except OSError as exc:
            log.warning("journal: %d change(s) not sent to the supervisor: %s", len(items), exc)
        finally:
            for fd in fds:
                os.close(fd)


Kept = tuple[bytes, float, tuple[int, ...]]
"""An allocation as last journaled: its record (JSON, as the worker sent it), when it was taken
(the worker's monotonic clock), and the fds of the supervisor's duplicates of its relay sockets.
A plain tuple of bytes and numbers, which the garbage collector stops tracking: a supervisor
holding ten thousand allocations does not make each collection walk them."""


_ANCILLARY_BYTES = socket.CMSG_SPACE(MAX_CHANNEL_FDS * array.array("i").itemsize)
_NOTHING_QUEUED = bytes(4)


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The fds a message brought (`socket.recv_fds`, without its per-call set-up)."""
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return fds.tolist()


def _more_waiting(sock: socket.socket) -> bool:
    """Whether another message waits (FIONREAD: the size of the next one; a peer gone reads 0,
    and the loop calls `read` again for it): cheaper than a receive that fails."""
    try:
        return fcntl.ioctl(sock.fileno(), termios.FIONREAD, _NOTHING_QUEUED) != _NOTHING_QUEUED
    except OSError:
        return False


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError as exc:
            log.debug("journal: closing fd %d: %s", fd, exc)


class Journal:
    """The supervisor's side: one worker's live allocations, by listener and client."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, Address], Kept] = {}
        self.received = 0  # messages
        self.received_bytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def read(self, channel: Channel) -> None:
        """Take every message the worker has queued (call when the channel is readable)."""
        sock = channel.sock
        if sock.gettimeout() != 0.0:  # the supervisor's sends set a timeout (a syscall each)
            sock.settimeout(0.0)
        while True:
            try:
                data, ancillary, _flags, _addr = sock.recvmsg(
                    MAX_CHANNEL_MESSAGE_BYTES, _ANCILLARY_BYTES
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("journal: channel closed: %s", exc)
                return
            fds = _received_fds(ancillary)
            if not data:
                _close(fds)
                return
            self.received += 1
            self.received_bytes += len(data)
            try:
                changes = read_journal(data)
            except WorkerMessageError as exc:
                log.warning("journal: unreadable message from the worker left out: %s", exc)
                _close(fds)
            else:
                counted = sum([change[4] for change in changes])
                if counted == len(fds):
                    self.take(changes, fds)
                else:
                    log.warning(
                        "journal: a batch naming %d fd(s) came with %d: left out",
                        counted,
                        len(fds),
                    )
                    _close(fds)
            if not _more_waiting(sock):
                return

    def take(self, changes: Iterable[JournalChange], fds: Sequence[int]) -> None:
        """Apply a batch's changes in order; `fds` are the new entries' relay sockets in the
        same order (this journal owns them)."""
        used = 0
        for listener, client, at, record, count in changes:
            if record is not None:
                self.keep(listener, client, at, record, fds[used : used + count])
                used += count
            else:
                self.forget(listener, client)

    def keep(
        self, listener: str, client: Address, at: float, record: bytes, fds: Sequence[int]
    ) -> None:
        """The allocation's record as of `at`; with `fds` (this journal owns them) it is new."""
        key = (listener, client)
        old = self.entries.get(key)
        if old is None or fds:
            if old is not None:
                _close(old[2])  # the client allocated anew on the same 5-tuple
            self.entries[key] = (record, at, tuple(fds))
        else:
            self.entries[key] = (record, at, old[2])

    def forget(self, listener: str, client: Address) -> None:
        gone = self.entries.pop((listener, client), None)
        if gone is not None:
            _close(gone[2])

    def live(
        self, listeners: Iterable[str], worker: int = 0, now: float | None = None
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """The live entries of `listeners` as the handoff document's listener objects, and
        their relay sockets' fds in the order they name them (the journal keeps owning them);
        entries that expired, lost their listener or cannot be read are dropped (and their
        sockets closed)."""
        now = time.monotonic() if now is None else now
        keep = set(listeners)
        by_listener: dict[str, list[dict[str, Any]]] = {}
        fds: list[int] = []
        for key, (text, at, held) in list(self.entries.items()):
            doc = _aged(text, len(held), now - at) if key[0] in keep else None
            if doc is None or not _readable(doc, key):
                self.forget(*key)
                continue
            by_listener.setdefault(key[0], []).append(doc)
            fds.extend(held)
        docs = [{"name": n, "worker": worker, "allocations": a} for n, a in by_listener.items()]
        return docs, fds

    def handover(
        self, listeners: Iterable[str], nonce_key: bytes, now: float | None = None
    ) -> tuple[str, list[int]]:
        """The live entries of `listeners` as a handoff document for a replacement worker, and
        the fds of their relay sockets in the order it names them."""
        docs, fds = self.live(listeners, now=now)
        document = {
            "format": FORMAT,
            "version": VERSION,
            "nonce_key": nonce_key.hex(),
            "listeners": docs,
        }
        return json.dumps(document, separators=(",", ":")), fds

    def close(self) -> None:
        for _text, _at, held in self.entries.values():
            _close(held)
        self.entries.clear()


def _readable(doc: dict[str, Any], key: tuple[str, Address]) -> bool:
    """Whether the replacement can read the record: one it cannot is left out, not the lot."""
    try:
        read_allocation(doc, f"{key[0]} {key[1]}")
    except HandoffFormatError as exc:
        log.warning("journal: allocation left out: %s", exc)
        return False
    return True


def _aged(text: bytes, sockets: int, elapsed: float) -> dict[str, Any] | None:
    """The record `elapsed` seconds later; None when it expired, lacks its relay sockets or is
    not a JSON object."""
    try:
        record = json.loads(text)
        left = float(record["expires_in_s"]) - elapsed
        wanted = 2 if record.get("additional") else 1
        if left <= 0 or sockets != wanted:
            return None
        permissions = {
            ip: float(t) - elapsed
            for ip, t in record["permissions"].items()
            if float(t) - elapsed > 0
        }
        channels = [
            {**ch, "expires_in_s": float(ch["expires_in_s"]) - elapsed}
            for ch in record["channels"]
            if float(ch["expires_in_s"]) - elapsed > 0
        ]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("journal: an unreadable record left out: %r", exc)
        return None
    return {**record, "expires_in_s": left, "permissions": permissions, "channels": channels}
