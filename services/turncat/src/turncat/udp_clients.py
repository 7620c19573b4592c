"""The tunnel's local UDP socket: one TURN session per client source address.

Datagrams that arrive while a client's allocation is being set up wait in a short queue; a client
whose allocation failed is held off for a while; a client that falls silent for
`client_idle_timeout_s` is deallocated. The sessions and tasks belong to the `ClientOwner` (the
`Tunnel`), which closes them on shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Coroutine
from typing import Any, Protocol, cast

from turncat.carrier import enlarge_receive_buffer
from turncat.errors import TurncatError
from turncat.session import DataCallback, LostCallback, TurnSession
from turncat.settings import TurncatSettings

log = logging.getLogger(__name__)

FAILED_CLIENT_HOLDOFF_S = 5.0
CLOSE_SUFFIX = "-close"
"""Names the tasks that close a session: shutdown lets them finish instead of cancelling them."""


class ClientOwner(Protocol):
    """What owns the clients' sessions and tasks (the `Tunnel`)."""

    @property
    def settings(self) -> TurncatSettings: ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

    def new_session(
        self, name: str, on_data: DataCallback, on_lost: LostCallback
    ) -> TurnSession: ...

    async def end_session(self, session: TurnSession) -> None: ...


class UdpLink:
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


class UdpClients(asyncio.DatagramProtocol):
    """The shared local UDP socket: demultiplexes datagrams by source address."""

    def __init__(self, owner: ClientOwner) -> None:
        self._owner = owner
        self._settings = owner.settings
        self._links: dict[tuple[str, int], UdpLink] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self._loop = asyncio.get_running_loop()
        self._stopped = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)
        enlarge_receive_buffer(transport)  # room for bursts from many local clients

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        link = self._links.get(addr)
        if link is None:
            if self._stopped:
                return
            link = UdpLink(addr, self._settings.pending_datagrams)
            self._links[addr] = link
            self._owner.spawn(self._open(link), name=f"udp:{addr[0]}:{addr[1]}-open")
        else:
            if link.failed:
                return
            link.packets += 1
        if link.pending is not None:
            link.pending.append(data)
        else:
            link.session.send(data)  # type: ignore[union-attr]

    async def _open(self, link: UdpLink) -> None:
        addr = link.addr
        name = f"udp:{addr[0]}:{addr[1]}"
        transport = self._transport
        assert transport is not None

        def on_data(data: bytes) -> None:
            transport.sendto(data, addr)

        def on_lost(exc: Exception | None) -> None:
            self._drop(link, "relay lost")

        session = self._owner.new_session(name, on_data, on_lost)
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
            await self._owner.end_session(session)
            return
        log.info("%s: new client", name)
        pending, link.pending = link.pending, None
        for data in pending or ():
            session.send(data)
        self._arm_idle(link)

    def _forget(self, link: UdpLink) -> None:
        if self._links.get(link.addr) is link:
            del self._links[link.addr]

    def _arm_idle(self, link: UdpLink) -> None:
        # A packet counter instead of a timestamp keeps the clock off the per-datagram path; a
        # client is dropped after one to two idle periods of silence.
        link.checked = link.packets
        link.idle_handle = self._loop.call_later(
            self._settings.client_idle_timeout_s, self._check_idle, link
        )

    def _check_idle(self, link: UdpLink) -> None:
        if self._links.get(link.addr) is not link:
            return
        if link.packets == link.checked:
            self._drop(link, "idle")
        else:
            self._arm_idle(link)

    def _drop(self, link: UdpLink, why: str) -> None:
        if self._links.get(link.addr) is link:
            del self._links[link.addr]
        if link.idle_handle is not None:
            link.idle_handle.cancel()
        if link.session is not None:
            log.info("udp:%s:%s: client %s, deallocating", link.addr[0], link.addr[1], why)
            name = f"udp:{link.addr[0]}:{link.addr[1]}{CLOSE_SUFFIX}"
            self._owner.spawn(self._owner.end_session(link.session), name=name)

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
