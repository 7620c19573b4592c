"""The established-channel relay in C, where it was built; stunnerd relays in Python otherwise.

At media rates (tens of datagrams per second on each of thousands of relay sockets) the event
loop wakes up, makes a bytes object and an address tuple, and runs a Python callback for every
datagram. `FastPath` hands the listener and relay sockets of TURN-UDP listeners to the C
extension `stunnerd._fastpath` instead: the loop watches one epoll descriptor, and each wake-up
drains every ready socket with recvmmsg, relays the datagrams of bound channels (sendto to the
peer, sendmmsg of ChannelData to clients) and gives Python only the rest, which goes through
the engine as before, except junk the engine would drop unread (`watch_listener`'s
`max_stun_bytes`), which C drops itself, plain STUN Binding requests, which C answers as the
engine would (`answer_binding`), and an Allocate without credentials, the first request of every
allocation, which C answers with the engine's own 401 (`answer_challenges`). The tables are
fed from the same channel-route effects as the Python routes. Counters are kept in C per slot
(a listener's or a cluster's `Traffic` list) and folded into those lists by `fold()`.
`STUNNERD_FASTPATH=0` turns it off (`ServerTuning.fastpath`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from stunnerd.fastpath.table import FastPathRoutes

try:
    from stunnerd import _fastpath
except ImportError:  # not built (no compiler at install time): the Python path relays
    _fastpath = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

Address = tuple[str, int]
Handler = Callable[[bytes, Any], None]


def available() -> bool:
    return _fastpath is not None


def factory(enabled: bool = True) -> Callable[[asyncio.AbstractEventLoop], FastPath] | None:
    """What builds the C relay of an event loop (a `stunnerd.net.ports.FastPathFactory`): None
    when it is turned off (`ServerTuning.fastpath`) or was not built."""
    return FastPath if enabled and available() else None


class FastPath:
    """The C relay of one event loop: its sockets, routes, counter slots and slow-path handlers."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        if _fastpath is None:
            raise RuntimeError("stunnerd._fastpath is not built")
        self.relay = _fastpath.FastRelay()
        self.loop = loop
        self.handlers: dict[int, Handler] = {}
        self.slots: list[list[int]] = []
        self._slot_of: dict[int, int] = {}
        self.closed = False
        loop.add_reader(self.relay.fileno(), self._ready)

    def slot(self, counts: list[int]) -> int:
        """The C counter slot that folds into `counts` (a `Traffic` list, kept alive here)."""
        slot = self._slot_of.get(id(counts))
        if slot is None:
            slot = self._slot_of[id(counts)] = len(self.slots)
            self.slots.append(counts)
        return slot

    def watch_listener(
        self,
        sock: socket.socket,
        counts: list[int],
        handler: Handler,
        max_stun_bytes: int = 0,
        max_datagram_bytes: int = 0,
    ) -> None:
        """Read a client-facing socket here; `handler(data, addr)` gets what no route takes.

        With `max_stun_bytes`, what the engine would drop unread (neither ChannelData nor a
        valid STUN header within the limit) is dropped in C and never reaches `handler`. With
        `max_datagram_bytes`, at most that much of a datagram is read; a longer one is dropped.
        """
        self.handlers[sock.fileno()] = handler
        self.relay.watch(
            sock.fileno(),
            _fastpath.LISTENER,
            self.slot(counts),
            max_stun_bytes,
            max_datagram_bytes,
        )

    def answer_binding(self, sock: socket.socket, software: str | None) -> None:
        """Answer plain STUN Binding requests on a watched listener in C, with the bytes the
        engine would send (XOR-MAPPED-ADDRESS, `software` as SOFTWARE, FINGERPRINT). A Binding
        request the engine would not answer with plain success (a comprehension-required
        attribute, more than a few attributes) still reaches the handler (fastpath/binding.h)."""
        self.relay.answer_binding(sock.fileno(), (software or "").encode())

    def watch_relay(self, sock: socket.socket, counts: list[int], handler: Handler) -> None:
        """Read an allocation's relay socket here; datagrams sent on to clients count in the
        listener's `counts` (tx)."""
        self.handlers[sock.fileno()] = handler
        self.relay.watch(sock.fileno(), _fastpath.RELAY, self.slot(counts))

    def unwatch(self, sock: socket.socket) -> None:
        """Before closing `sock`: stop reading it and forget every route through it."""
        fd = sock.fileno()
        if fd < 0 or self.closed:
            return
        self.handlers.pop(fd, None)
        self.relay.unwatch(fd)

    def _ready(self) -> None:
        try:
            misses = self.relay.poll()
        except Exception:
            log.exception("fast path: poll failed")
            return
        handlers = self.handlers
        for fd, data, addr in misses:
            handler = handlers.get(fd)
            if handler is not None:
                handler(data, addr)

    def answer_challenges(
        self, listener: socket.socket, template: bytes | None, valid_s: float
    ) -> None:
        """Answer an Allocate without MESSAGE-INTEGRITY on a watched listener in C for `valid_s`
        seconds, with `template`: the engine's 401 to such a request (`TurnEngine
        .challenge_template`, its nonce fresh); None: the engine answers every one. Past
        `valid_s` the engine answers them until this is called again.

        Where the engine differs: it gives a retransmission the answer it cached for its
        transaction, and a request that reuses the transaction id of an authenticated one
        without its credentials gets that cached answer from it but a 401 from C."""
        self.relay.answer_challenges(listener.fileno(), template or b"", valid_s)

    def challenge_budget(
        self, listener: socket.socket, rate_per_s: float, burst: int, sources: int
    ) -> ListenerBudget:
        """The challenges of a watched listener, budgeted per source IP in C (`rate_per_s` 0: no
        limit): C's own and, through the budget returned, the engine's."""
        fd = listener.fileno()
        self.relay.challenge_budget(fd, rate_per_s, float(burst), sources)
        return ListenerBudget(self, fd)

    def routes(self, listener: socket.socket) -> FastPathRoutes:
        """The channel routes of the listener reading `listener`, as this relay's `RouteTable`."""
        return FastPathRoutes(self, listener)

    def fold(self) -> None:
        """Add the counts made in C since the last fold into their `Traffic` lists."""
        if self.closed:
            return
        slots = self.slots
        for slot, rx_pkts, rx_bytes, tx_pkts, tx_bytes in self.relay.take_counters():
            counts = slots[slot]
            counts[0] += rx_pkts
            counts[1] += rx_bytes
            counts[2] += tx_pkts
            counts[3] += tx_bytes

    def take_drops(self, listener: socket.socket) -> tuple[int, int, int]:
        """Datagrams dropped on a watched listener since the last call: (over its STUN message
        size limit, over its datagram limit, challenges not sent: the source over budget)."""
        fd = listener.fileno()
        if fd < 0 or self.closed:
            return 0, 0, 0
        oversized, truncated, suppressed = self.relay.take_drops(fd)
        return oversized, truncated, suppressed

    def stats(self) -> dict[str, int]:
        return dict(self.relay.stats())

    def close(self) -> None:
        if self.closed:
            return
        self.fold()
        self.closed = True
        self.loop.remove_reader(self.relay.fileno())
        self.relay.close()


class ListenerBudget:
    """The challenge budget of one listener, kept in C (`FastPath.challenge_budget`): the
    engine spends from it for the challenges it sends itself (`stunnerd.turn.guard
    .SourceBudget`), so a source has one bucket whoever answers."""

    __slots__ = ("fastpath", "fd")

    def __init__(self, fastpath: FastPath, fd: int) -> None:
        self.fastpath = fastpath
        self.fd = fd

    def allow(self, ip: str, now: float) -> bool:
        if self.fastpath.closed:
            return True
        try:  # a link-local address's zone is not part of the key, as C reads the datagram's
            return self.fastpath.relay.challenge_allow(self.fd, ip.partition("%")[0])
        except ValueError:  # the listener is gone
            return True
