"""What the asyncio edge needs of the parts beside it, as interfaces it is handed.

The edge (`stunnerd.net`) relays; the cluster-wide user quota (`stunnerd.quota.ClusterQuota`),
the kernel offload (`stunnerd.offload.manager.OffloadManager`), the C relay
(`stunnerd.fastpath.FastPath`) and the handoff document (`stunnerd.handoff`) are built by the
process that builds the server (`stunnerd.app`, `stunnerd.workers.child`,
`stunnerd.workers.local`) and passed down as the interfaces below, which those classes satisfy
structurally. The import contract "stunnerd's network edge reaches quota, handoff, offload and
the fast path only through interfaces" (pyproject.toml) keeps it so.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from stunnerd.route_table.table import Address, RouteTable, Traffic
from stunnerd.turn.allocation import Allocation
from stunnerd.turn.guard import SourceBudget

Datagram = Callable[[bytes, Any], None]
"""A socket's handler: `(data, address)` for what the C relay does not route."""


class QuotaLeases(Protocol):
    """The cluster-wide user quota as one listener's allocations meet it: a lease per
    allocation, taken before its relay opens (486 when refused), renewed and released with it."""

    @property
    def enforcing(self) -> bool:
        """Whether a limit is set (`admin.user_quota` > 0)."""

    @property
    def limit(self) -> int:
        """The allocations one user may hold across the cluster."""

    def lease_id(self, listener: str, client: Address) -> str:
        """A fresh lease name for `client`'s allocation on `listener`."""

    async def acquire(self, user_id: str, lease: str, lifetime_s: float) -> bool:
        """May `user_id` have one more allocation? On yes, `lease` is held until released."""

    def renew(self, lease: str, lifetime_s: float) -> None:
        """The allocation was refreshed: keep its lease that much longer."""

    def release(self, lease: str) -> None:
        """The allocation is gone."""


class QuotaPort(QuotaLeases, Protocol):
    """The cluster-wide user quota as the server holds it (`stunnerd.quota.ClusterQuota`)."""

    def configure(self, scope: str, realm: str, limit: int) -> None:
        """The running config's Gateway id, realm and `admin.user_quota` (0: no quota)."""

    def status(self) -> dict[str, Any]:
        """Its state, for `/status`."""

    async def close(self) -> None:
        """Release what this process holds and disconnect."""


class OffloadPort(Protocol):
    """The kernel offload of TURN-UDP channels (`stunnerd.offload.manager.OffloadManager`)."""

    def routes(self, listener: str, address: Address, traffic: Traffic) -> RouteTable:
        """The kernel's copy of `listener`'s channel routes; `address` is its bound address,
        `traffic` its counters (what the kernel relays is added to them)."""

    def configure(self, engine: str, interfaces: tuple[str, ...] | list[str] = ()) -> None:
        """Attach the config's offload engine (`admin.offload_engine`) to `interfaces`."""

    def poll(self) -> None:
        """Bring the traffic counters up to date with what the kernel relayed."""

    def status(self) -> dict[str, Any]:
        """Its state, for `/status`."""

    def let_go(self) -> None:
        """Forget the kernel program without detaching it (a successor took it over)."""

    def close(self) -> None:
        """Detach: nothing is relayed in the kernel any more."""


class FastPathPort(Protocol):
    """The C relay of one event loop's TURN-UDP sockets (`stunnerd.fastpath.FastPath`)."""

    def watch_listener(
        self,
        sock: socket.socket,
        counts: list[int],
        handler: Datagram,
        max_stun_bytes: int = 0,
        max_datagram_bytes: int = 0,
    ) -> None:
        """Read a client-facing socket in C; `handler` gets what no route takes."""

    def answer_binding(self, sock: socket.socket, software: str | None) -> None:
        """Answer plain STUN Binding requests on a watched listener in C."""

    def answer_challenges(
        self, listener: socket.socket, template: bytes | None, valid_s: float
    ) -> None:
        """Answer an Allocate without credentials on a watched listener in C with `template`
        (the engine's 401) for `valid_s` seconds; None: the engine answers."""

    def challenge_budget(
        self, listener: socket.socket, rate_per_s: float, burst: int, sources: int
    ) -> SourceBudget:
        """Budget the listener's challenges per source IP in C; what the engine spends from."""

    def watch_relay(self, sock: socket.socket, counts: list[int], handler: Datagram) -> None:
        """Read an allocation's relay socket in C."""

    def unwatch(self, sock: socket.socket) -> None:
        """Before closing `sock`: stop reading it and forget every route through it."""

    def routes(self, listener: socket.socket) -> RouteTable:
        """The C relay's copy of the channel routes of the listener reading `listener`."""

    def fold(self) -> None:
        """Add what C counted since the last fold into the traffic counters."""

    def take_drops(self, listener: socket.socket) -> tuple[int, int, int]:
        """Datagrams dropped on a watched listener since the last call: (over its STUN message
        size limit, over its datagram limit, challenges not sent: the source over budget)."""

    def stats(self) -> dict[str, int]:
        """Its counters, for `/status`."""

    def close(self) -> None:
        """Stop reading every socket."""


FastPathFactory = Callable[[asyncio.AbstractEventLoop], FastPathPort]
"""The C relay for an event loop (one per loop, built with the first TURN-UDP listener)."""


class AllocationJournal(Protocol):
    """Where a worker's TURN-UDP allocations are kept while it lives, so that they outlive it
    (`stunnerd.handoff.transport.records.RecordJournal` over
    `stunnerd.handoff.transport.journal.JournalWriter`)."""

    def changed(
        self, listener: str, allocation: Allocation, now: float, fds: Sequence[int]
    ) -> None:
        """The allocation as it stands at `now` (the loop's clock); `fds` its relay sockets
        when it is new."""

    def deleted(self, listener: str, client: Address) -> None:
        """The allocation is gone: its relay sockets can be closed."""


class HandedChannel(Protocol):
    """A channel of a handed-over allocation (`stunnerd.handoff.transport.state.ChannelRecord`)."""

    @property
    def number(self) -> int: ...

    @property
    def peer(self) -> Address: ...

    @property
    def expires_in_s(self) -> float: ...


class HandedAllocation(Protocol):
    """An allocation another process made (`stunnerd.handoff.transport.state.AllocationRecord`):
    its lifetimes are seconds left, its relay sockets travel beside it, named by `relay` and
    `additional`."""

    @property
    def client(self) -> Address: ...

    @property
    def user_id(self) -> str: ...

    @property
    def key(self) -> bytes: ...

    @property
    def username(self) -> str: ...

    @property
    def relay(self) -> Address: ...

    @property
    def family(self) -> int: ...

    @property
    def expires_in_s(self) -> float: ...

    @property
    def additional(self) -> Address | None: ...

    @property
    def tcp(self) -> bool: ...

    @property
    def permissions(self) -> Mapping[str, float]: ...

    @property
    def channels(self) -> Sequence[HandedChannel]: ...


class HandedListener(Protocol):
    """One listener's handed-over allocations
    (`stunnerd.handoff.transport.state.ListenerRecord`)."""

    @property
    def name(self) -> str: ...

    @property
    def allocations(self) -> Sequence[HandedAllocation]: ...


class HandedState(Protocol):
    """What another process handed over (`stunnerd.handoff.transport.state.HandoffState`)."""

    @property
    def listeners(self) -> Sequence[HandedListener]: ...

    def relay_addresses(self) -> list[Address]:
        """Every relay socket the state names, in the order they travel."""
