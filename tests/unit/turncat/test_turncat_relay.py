"""The local UDP side of the tunnel with in-memory sessions and transport (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

from turncat.errors import AuthFailedError
from turncat.relay import Tunnel
from turncat.session import DataCallback, LostCallback
from turncat.settings import TurncatSettings
from turncat.udp_clients import UdpClients
from turncat.uri import LocalAddress


class FakeSession:
    def __init__(self, name: str, on_data: DataCallback, on_lost: LostCallback) -> None:
        self.name = name
        self.on_data = on_data
        self.on_lost = on_lost
        self.sent: list[bytes] = []
        self.may_open = asyncio.Event()
        self.fail: Exception | None = None
        self.closed = asyncio.Event()

    async def open(self) -> None:
        await self.may_open.wait()
        if self.fail is not None:
            raise self.fail

    def send(self, payload: bytes) -> None:
        self.sent.append(payload)

    async def close(self) -> None:
        self.closed.set()


class FakeTransport:
    def __init__(self) -> None:
        self.out: list[tuple[bytes, Any]] = []
        self.closed = False

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self.out.append((data, addr))

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def make(**settings: Any) -> tuple[Tunnel, UdpClients, list[FakeSession], FakeTransport]:
    sessions: list[FakeSession] = []

    def factory(name: str, on_data: DataCallback, on_lost: LostCallback) -> Any:
        s = FakeSession(name, on_data, on_lost)
        sessions.append(s)
        return s

    tunnel = Tunnel(LocalAddress("udp", "127.0.0.1", 1), factory, TurncatSettings(**settings))
    clients = UdpClients(tunnel)
    tunnel._udp = clients  # what start() does after binding the socket
    transport = FakeTransport()
    clients.connection_made(transport)  # type: ignore[arg-type]
    return tunnel, clients, sessions, transport


async def settle() -> None:
    """Let the tasks that are already runnable run (no timer involved)."""
    for _ in range(5):
        await asyncio.sleep(0)


A = ("127.0.0.1", 1111)
B = ("127.0.0.1", 2222)


async def test_datagrams_wait_for_the_allocation_and_go_out_in_order(
    no_leaked_tasks: None,
) -> None:
    tunnel, clients, sessions, transport = make()
    for i in range(3):
        clients.datagram_received(f"a{i}".encode(), A)
    clients.datagram_received(b"b0", B)
    await settle()
    assert [s.name for s in sessions] == ["udp:127.0.0.1:1111", "udp:127.0.0.1:2222"]
    assert sessions[0].sent == []
    sessions[0].may_open.set()
    await settle()
    clients.datagram_received(b"a3", A)
    assert sessions[0].sent == [b"a0", b"a1", b"a2", b"a3"]
    assert sessions[1].sent == []
    sessions[0].on_data(b"reply")
    assert transport.out == [(b"reply", A)]
    sessions[1].may_open.set()
    await tunnel.aclose()
    assert sessions[0].closed.is_set()
    assert transport.closed


async def test_client_whose_allocation_failed_is_held_off(no_leaked_tasks: None) -> None:
    tunnel, clients, sessions, _ = make()
    clients.datagram_received(b"first", A)
    await settle()
    sessions[0].fail = AuthFailedError("bad password")
    sessions[0].may_open.set()
    async with asyncio.timeout(5):
        await sessions[0].closed.wait()
    for _ in range(10):
        clients.datagram_received(b"again", A)
    await settle()
    assert len(sessions) == 1
    await tunnel.aclose()


async def test_silent_client_is_deallocated_and_a_new_datagram_reallocates(
    no_leaked_tasks: None,
) -> None:
    tunnel, clients, sessions, _ = make(client_idle_timeout_s=0.01)
    clients.datagram_received(b"hello", A)
    await settle()
    sessions[0].may_open.set()
    async with asyncio.timeout(5):
        await sessions[0].closed.wait()
    clients.datagram_received(b"back", A)
    await settle()
    assert len(sessions) == 2
    sessions[1].may_open.set()
    await tunnel.aclose()
    assert sessions[1].closed.is_set()


async def test_lost_relay_drops_only_that_client(no_leaked_tasks: None) -> None:
    tunnel, clients, sessions, _ = make()
    clients.datagram_received(b"a", A)
    clients.datagram_received(b"b", B)
    await settle()
    for s in sessions:
        s.may_open.set()
    await settle()
    sessions[0].on_lost(None)
    async with asyncio.timeout(5):
        await sessions[0].closed.wait()
    clients.datagram_received(b"b2", B)
    assert sessions[1].sent == [b"b", b"b2"]
    assert not sessions[1].closed.is_set()
    await tunnel.aclose()
