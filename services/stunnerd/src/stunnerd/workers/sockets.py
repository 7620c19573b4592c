"""Listener sockets owned by the supervisor, so that no worker start, stop or crash moves a flow.

SO_REUSEPORT picks a group member by hashing the client's address over the sockets bound to the
port: add or remove a socket and flows move to other members, i.e. to workers that hold none of
their allocations (438, 437, a dead call). So the supervisor binds, for every listener, one socket
per worker before any worker serves, and holds them for as long as the listener is configured:
the group never changes while the config does not. A worker receives its sockets by SCM_RIGHTS
over a Unix socket pair (`FdChannel`) and serves a duplicate; while a worker is down, its share of
the packets waits in its socket's receive queue and the replacement reads it. The same channel
carries the nonce key, so every worker, and every incarnation of it, honours the others' nonces.
"""

from __future__ import annotations

import array
import contextlib
import errno
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from stunner_common.config import ListenerConfig, StunnerConfig
from stunner_common.contracts.socket_key import SocketKey, listener_socket_key
from stunner_common.contracts.worker_messages import (
    MAX_CHANNEL_MESSAGE_BYTES,
    ChannelMessage,
    ListenerSocket,
    NonceKey,
    OffloadMap,
    OffloadOff,
    RelaySocket,
    decode_channel,
    encode,
)
from stunnerd.net.binding import allow_both_families

LISTEN_BACKLOG = 1024
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
NONCE_KEY_BYTES = 32
CHANNEL_TIMEOUT_S = 10.0


def listener_key(listener: ListenerConfig, bind_host: str, node_address: str = "") -> SocketKey:
    return listener_socket_key(
        listener.protocol, listener.address, listener.port, bind_host, node_address
    )


def config_keys(
    config: StunnerConfig | None, bind_host: str, node_address: str = ""
) -> set[SocketKey]:
    if config is None:
        return set()
    return {listener_key(lst, bind_host, node_address) for lst in config.listeners}


def bind_reuseport(key: SocketKey, port: int) -> socket.socket:
    """One member of a listener's SO_REUSEPORT group, bound (and listening, for TCP)."""
    family = socket.AF_INET6 if ":" in key.host else socket.AF_INET
    kind = socket.SOCK_STREAM if key.kind == "tcp" else socket.SOCK_DGRAM
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        else:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        sock.setblocking(False)
        allow_both_families(sock, key.host)
        sock.bind((key.host, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


class SocketGroups:
    """The supervisor's sockets: per listener key, one bound socket per worker index."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.groups: dict[SocketKey, list[socket.socket]] = {}

    def bind(self, keys: Iterable[SocketKey]) -> None:
        """Bind the groups of `keys` that do not exist yet; all or nothing per group.

        Raises OSError (port in use, address not available) naming the key.
        """
        for key in sorted(keys):
            if key in self.groups:
                continue
            group: list[socket.socket] = []
            try:
                port = key.port
                for _ in range(self.workers):
                    sock = bind_reuseport(key, port)
                    group.append(sock)
                    port = int(sock.getsockname()[1])  # port 0: the others join the first's
            except OSError as exc:
                for sock in group:
                    sock.close()
                raise OSError(
                    exc.errno, f"cannot bind {key.kind.upper()} {key.host}:{key.port}: {exc}"
                ) from exc
            self.groups[key] = group

    def retain(self, keys: Iterable[SocketKey]) -> None:
        """Close every group not in `keys` (its listener is gone from the config)."""
        keep = set(keys)
        for key in [k for k in self.groups if k not in keep]:
            for sock in self.groups.pop(key):
                sock.close()

    def of_worker(self, index: int, keys: Iterable[SocketKey]) -> list[tuple[SocketKey, int]]:
        return [(key, self.groups[key][index].fileno()) for key in sorted(keys)]

    def port(self, key: SocketKey) -> int:
        return int(self.groups[key][0].getsockname()[1])

    def close(self) -> None:
        self.retain(())


class FdChannel:
    """One end of a supervisor ↔ worker Unix socket pair: the contract's channel messages
    (`stunner_common.contracts.worker_messages`), some carrying fds.

    SOCK_SEQPACKET keeps message boundaries; a message sent is in the peer's receive queue when
    `send` returns, so a worker that drains the channel after reading a request on its stdin
    sees every socket the supervisor sent before writing that request.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def pair(cls) -> tuple[FdChannel, socket.socket]:
        """The supervisor's end, and the socket to hand to the child (inheritable)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs.set_inheritable(True)
        return cls(ours), theirs

    @classmethod
    def from_fd(cls, fd: int) -> FdChannel:
        return cls(socket.socket(fileno=fd))

    def send(self, message: ChannelMessage, fd: int | None = None) -> None:
        """One message with its fd."""
        self.send_many(message, () if fd is None else (fd,))

    def send_many(self, message: ChannelMessage, fds: Sequence[int]) -> int:
        """One message with its fds (duplicated into the peer); the bytes it took.

        A message the peer could not read whole (over `MAX_CHANNEL_MESSAGE_BYTES`) is not sent:
        OSError (EMSGSIZE).
        """
        return self.send_bytes(encode(message), fds)

    def send_bytes(self, data: bytes, fds: Sequence[int]) -> int:
        """`send_many` of a message already encoded (`worker_messages.encode`, or a journal
        batch as `worker_messages.journal_message` makes it)."""
        if len(data) > MAX_CHANNEL_MESSAGE_BYTES:
            raise OSError(errno.EMSGSIZE, f"a message of {len(data)} bytes is too large")
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        # Without a timeout, as the journal's reads: a socket with one polls before each call,
        # and setting one is a syscall or two. Only a full channel waits, and for a while.
        if self.sock.gettimeout() != 0.0:
            self.sock.settimeout(0.0)
        try:
            self.sock.sendmsg((data,), rights)
        except BlockingIOError:
            self.sock.settimeout(CHANNEL_TIMEOUT_S)
            self.sock.sendmsg((data,), rights)
        return len(data)

    def receive(self, *, block: bool) -> tuple[ChannelMessage, int | None] | None:
        """The next message and its fd (the caller owns it), or None when nothing is queued
        (`block=False`). A message this build cannot read: `WorkerMessageError`."""
        self.sock.settimeout(CHANNEL_TIMEOUT_S if block else 0.0)
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_CHANNEL_MESSAGE_BYTES, 1)
        except BlockingIOError:
            return None
        if not data:
            for fd in fds:
                os.close(fd)
            raise ConnectionError("the supervisor closed the socket channel")
        try:
            message = decode_channel(data)
        except ValueError:
            for fd in fds:
                os.close(fd)
            raise
        return message, fds[0] if fds else None

    def close(self) -> None:
        self.sock.close()


class InheritedSockets:
    """The worker's side: the sockets the supervisor handed over, by key, and the nonce key."""

    def __init__(self, channel: FdChannel) -> None:
        self.channel = channel
        self.sockets: dict[SocketKey, socket.socket] = {}
        self.nonce_key: bytes | None = None
        # Relay sockets of the allocations a dead predecessor journaled, in the order the
        # adoption document that follows them names them (`take_relays`).
        self.relay_sockets: list[socket.socket] = []
        # The supervisor's offload maps (by name), their attach modes and this worker's owner
        # tag, or why there are none.
        self.offload_fds: dict[str, int] = {}
        self.offload_info: dict[str, Any] = {}
        self.offload_reason = "the supervisor has not loaded the offload program"

    def wait_nonce_key(self) -> bytes:
        """Block until the supervisor's first message (the nonce key) arrives."""
        while self.nonce_key is None:
            got = self.channel.receive(block=True)
            if got is not None:
                self._take(*got)
        return self.nonce_key

    def drain(self) -> None:
        """Take every message queued on the channel (call before applying a config)."""
        while (got := self.channel.receive(block=False)) is not None:
            self._take(*got)

    def _take(self, message: ChannelMessage, fd: int | None) -> None:
        match message:
            case NonceKey(key=key):
                self.nonce_key = key
            case OffloadMap(name=name, modes=modes, owner=owner) if fd is not None:
                old_fd = self.offload_fds.pop(name, None)
                if old_fd is not None:
                    os.close(old_fd)
                self.offload_fds[name] = fd  # a BPF map, not a socket
                self.offload_info = {"modes": dict(modes), "owner": owner}
                self.offload_reason = ""
                return
            case OffloadOff(reason=reason):
                self._close_offload()
                self.offload_reason = reason or "offload is off"
            case RelaySocket() if fd is not None:
                self.relay_sockets.append(_socket(fd))
                return
            case ListenerSocket(key=key) if fd is not None:
                old = self.sockets.pop(key, None)
                if old is not None:
                    old.close()
                self.sockets[key] = _socket(fd)
                return
        if fd is not None:
            os.close(fd)

    def retain(self, keys: Iterable[SocketKey]) -> None:
        keep = set(keys)
        for key in [k for k in self.sockets if k not in keep]:
            self.sockets.pop(key).close()

    def take_relays(self) -> list[socket.socket]:
        """The relay sockets received since the last call (the caller owns them)."""
        taken, self.relay_sockets = self.relay_sockets, []
        return taken

    def take(self, key: SocketKey) -> socket.socket | None:
        """A duplicate of the socket for this listener (the listener owns and closes it)."""
        sock = self.sockets.get(key)
        if sock is None:
            return None
        dup = sock.dup()
        dup.setblocking(False)
        return dup

    def _close_offload(self) -> None:
        for fd in self.offload_fds.values():
            os.close(fd)
        self.offload_fds.clear()
        self.offload_info = {}

    def close(self) -> None:
        self.retain(())
        for sock in self.take_relays():
            sock.close()
        self._close_offload()
        self.channel.close()


def _socket(fd: int) -> socket.socket:
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sock


def send_offload(
    channel: FdChannel, maps: tuple[int, int] | None, modes: dict[str, str], owner: int, reason: str
) -> None:
    """The supervisor's offload maps (duplicated into the worker), or why there are none."""
    if maps is None:
        channel.send(OffloadOff(reason))
        return
    for name, fd in zip(("chan", "peer"), maps, strict=True):
        channel.send(OffloadMap(name, modes, owner), fd)


def send_sockets(channel: FdChannel, entries: list[tuple[SocketKey, int]]) -> None:
    for key, fd in entries:
        channel.send(ListenerSocket(key), fd)


def send_relays(channel: FdChannel, fds: Iterable[int]) -> None:
    """Relay sockets for the worker to adopt, in the order its adoption document names them."""
    for fd in fds:
        channel.send(RelaySocket(), fd)


def new_nonce_key() -> bytes:
    return os.urandom(NONCE_KEY_BYTES)
