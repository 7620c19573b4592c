"""Coalesce relayed datagrams per destination and send each burst with one UDP GSO syscall.

On the relay hot path the kernel, not Python, costs most: every datagram is a `sendmsg`, a route
lookup and an skb. uvloop reads a socket until it runs dry and calls back once per datagram, so
under load many datagrams for the same destination arrive in one event-loop turn. `SendBatcher`
queues them per (socket, destination) and, at the end of that turn, sends each queue as one
`sendmsg` carrying a UDP_SEGMENT control message (Linux UDP GSO, ≥ 4.18): the kernel splits it
into the original datagrams. Only bursts are queued: a datagram that follows the previous one to
the same destination by more than `BURST_GAP_S` (media-rate traffic) goes out at once with a plain
`sendto`, since waiting for the end of the loop turn would cost more than it saves. Queued
datagrams wait for the rest of the current loop turn at most. If the kernel refuses GSO, batching
switches itself off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from typing import Any

log = logging.getLogger(__name__)

UDP_SEGMENT = 103  # linux/udp.h; the socket module does not name it
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 60_000
_GSO_SIZE = struct.Struct("=H").pack
_monotonic = time.monotonic
BURST_GAP_S = 200e-6  # a datagram this soon after the previous one to the same place is a burst
RECENT_MAX = 8192


def gso_supported() -> bool:
    """Probe once: can this kernel take a UDP_SEGMENT control message on loopback?"""
    try:
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
        ):
            rx.bind(("127.0.0.1", 0))
            tx.sendmsg([b"ab"], [(socket.SOL_UDP, UDP_SEGMENT, _GSO_SIZE(1))], 0, rx.getsockname())
        return True
    except OSError:
        return False


class SendBatcher:
    """Per-destination send queues flushed once per loop turn (or immediately when disabled)."""

    __slots__ = ("_loop", "_pending", "_recent", "_scheduled", "enabled")

    def __init__(self, loop: asyncio.AbstractEventLoop, *, enabled: bool = True) -> None:
        self._loop = loop
        self._pending: dict[tuple[socket.socket, Any], list[bytes]] = {}
        self._recent: dict[tuple[socket.socket, Any], float] = {}  # last send per destination
        self._scheduled = False
        self.enabled = enabled

    def send(self, sock: socket.socket, data: bytes, addr: Any) -> None:
        if not self.enabled:
            try:
                sock.sendto(data, addr)
            except OSError:  # full buffer or closed socket: UDP may drop
                return
            return
        key = (sock, addr)
        batch = self._pending.get(key)
        if batch is not None:
            batch.append(data)
            return
        now = _monotonic()
        recent = self._recent
        last = recent.get(key, 0.0)
        if len(recent) >= RECENT_MAX:
            recent.clear()
        recent[key] = now
        if now - last > BURST_GAP_S:  # not in a burst: send at once, no loop turn to wait for
            try:
                sock.sendto(data, addr)
            except OSError:
                return
            return
        self._pending[key] = [data]
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        if not pending:
            return
        self._pending = {}
        for (sock, addr), batch in pending.items():
            try:
                if len(batch) == 1:
                    sock.sendto(batch[0], addr)
                else:
                    self._send_segments(sock, addr, batch)
            except OSError as exc:
                if exc.errno in (5, 22, 92, 95):  # EIO, EINVAL, ENOPROTOOPT, EOPNOTSUPP
                    log.warning("UDP GSO refused (%s); sending datagrams one by one", exc)
                    self.enabled = False
                    for data in batch:
                        self.send(sock, data, addr)

    @staticmethod
    def _send_segments(sock: socket.socket, addr: Any, batch: list[bytes]) -> None:
        """Runs of equal-size datagrams (a run's last may be shorter) go out as one GSO send."""
        i, n = 0, len(batch)
        while i < n:
            size = len(batch[i])
            j = i + 1
            limit = min(n, i + GSO_MAX_SEGMENTS, i + max(1, GSO_MAX_BYTES // max(size, 1)))
            while j < limit and len(batch[j]) == size:
                j += 1
            if j < limit and 0 < len(batch[j]) < size:
                j += 1  # a shorter (but not empty) final segment is allowed
            with contextlib.suppress(BlockingIOError):  # a full buffer drops, as UDP may
                if j - i == 1 or size == 0:
                    for k in range(i, j):
                        sock.sendto(batch[k], addr)
                else:
                    sock.sendmsg(
                        [b"".join(batch[i:j])],
                        [(socket.SOL_UDP, UDP_SEGMENT, _GSO_SIZE(size))],
                        0,
                        addr,
                    )
            i = j
