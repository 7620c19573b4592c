"""TURN-DTLS with a pyOpenSSL client: the cookie exchange comes first, then STUN over DTLS."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import pytest
from aioice import stun
from fixtures.stunnerd.inproc import make_config, running_server
from OpenSSL import SSL

from stunnerd.net import dtls
from stunnerd.net.dtls import DtlsListener
from stunnerd.net.guard import ClientLimits, ConnectionLimits
from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.turn.guard import RequestLimits
from stunnerd.workers.local import LocalDataplane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


class DtlsClient:
    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        ctx = SSL.Context(SSL.DTLS_METHOD)
        ctx.set_verify(SSL.VERIFY_NONE, lambda *args: True)
        self.conn = SSL.Connection(ctx, None)
        self.conn.set_connect_state()
        self.received: list[bytes] = []

    async def flush(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = self.conn.bio_read(65536)
            except SSL.WantReadError:
                return
            await loop.sock_sendto(self.sock, data, self.server)

    async def recv_datagram(self) -> bytes:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(5):
            data = await loop.sock_recv(self.sock, 65536)
        self.received.append(data)
        return data

    async def handshake(self) -> None:
        while True:
            try:
                self.conn.do_handshake()
                await self.flush()
                return
            except SSL.WantReadError:
                await self.flush()
            self.conn.bio_write(await self.recv_datagram())

    async def request(self, message: stun.Message) -> stun.Message:
        self.conn.send(bytes(message))
        await self.flush()
        while True:
            self.conn.bio_write(await self.recv_datagram())
            try:
                return stun.parse_message(self.conn.recv(65536))
            except SSL.WantReadError:
                continue


async def test_dtls_hello_gets_a_cookie_first_then_stun_flows_over_dtls(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-DTLS",))
    port = config.listeners[0].port
    async with running_server(config) as server:
        listener = server.listeners["turn-dtls"]
        client = DtlsClient(("127.0.0.1", port))
        try:
            await client.handshake()
            first = client.received[0]
            assert first[0] == 22  # a handshake record...
            assert first[13] == 3  # ...carrying HelloVerifyRequest
            assert len(listener.sessions) == 1  # type: ignore[attr-defined]
            binding = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
            reply = await client.request(binding)
            assert reply.message_class == stun.Class.RESPONSE
            assert reply.attributes["XOR-MAPPED-ADDRESS"] == client.sock.getsockname()
        finally:
            client.sock.close()


async def test_a_spoofed_hello_gets_only_a_small_cookie_and_leaves_no_state(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-DTLS",))
    port = config.listeners[0].port
    async with running_server(config) as server:
        listener = server.listeners["turn-dtls"]
        client = DtlsClient(("127.0.0.1", port))
        try:
            with contextlib.suppress(SSL.WantReadError):
                client.conn.do_handshake()
            hello = client.conn.bio_read(65536)
            await asyncio.get_running_loop().sock_sendto(client.sock, hello, ("127.0.0.1", port))
            answer = await client.recv_datagram()
            assert answer[13] == 3
            assert len(answer) < 2 * len(hello)  # no certificate flight to a forged source
            assert listener.sessions == {}  # type: ignore[attr-defined]
        finally:
            client.sock.close()


@contextlib.asynccontextmanager
async def dtls_server(**connection: float) -> AsyncIterator[tuple[DtlsListener, int]]:
    config = make_config(("TURN-DTLS",))
    limits = ClientLimits(RequestLimits(), ConnectionLimits(**connection))  # type: ignore[arg-type]
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="127.0.0.1", limits=limits)))
    try:
        await dataplane.reconciler.apply(config)
        listener = dataplane.server.listeners["turn-dtls"]
        assert isinstance(listener, DtlsListener)
        yield listener, config.listeners[0].port
    finally:
        await dataplane.close()


async def returned_cookie(client: DtlsClient, port: int) -> None:
    """ClientHello, HelloVerifyRequest, ClientHello with the cookie; then stop."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(SSL.WantReadError):
        client.conn.do_handshake()
    await loop.sock_sendto(client.sock, client.conn.bio_read(65536), ("127.0.0.1", port))
    client.conn.bio_write(await client.recv_datagram())
    with contextlib.suppress(SSL.WantReadError):
        client.conn.do_handshake()
    await client.flush()


def limits_moved(listener: DtlsListener) -> dict[str, int]:
    """The limits the listener counted refusals by (`stunner_listener_limit_refusals`)."""
    return {limit: n for limit, n in listener.engine.refusals.limit_counts() if n}


async def eventually(check: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(10):
        while not check():  # noqa: ASYNC110 - the server's timers decide
            await asyncio.sleep(0.01)


async def test_dtls_sessions_over_the_per_source_cap_are_not_started(
    no_leaked_tasks: None,
) -> None:
    async with dtls_server(max_per_source=2) as (listener, port):
        clients = [DtlsClient(("127.0.0.1", port)) for _ in range(3)]
        try:
            for client in clients[:2]:
                await client.handshake()
            await returned_cookie(clients[2], port)
            await eventually(lambda: listener.refused_connections == 1, "third refused")
            assert len(listener.sessions) == 2
            assert listener.sources.counts == {"127.0.0.1": 2}
            assert limits_moved(listener) == {"connections_per_source": 1}
        finally:
            for client in clients:
                client.sock.close()


async def test_hellos_past_the_session_table_are_ignored_and_counted(
    no_leaked_tasks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dtls, "MAX_SESSIONS", 1)
    async with dtls_server() as (listener, port):
        first, second = DtlsClient(("127.0.0.1", port)), DtlsClient(("127.0.0.1", port))
        try:
            await first.handshake()
            with contextlib.suppress(SSL.WantReadError):
                second.conn.do_handshake()
            hello = second.conn.bio_read(65536)
            await asyncio.get_running_loop().sock_sendto(second.sock, hello, ("127.0.0.1", port))
            await eventually(lambda: "dtls_sessions" in limits_moved(listener), "hello ignored")
            assert limits_moved(listener) == {"dtls_sessions": 1}
            assert len(listener.sessions) == 1
        finally:
            first.sock.close()
            second.sock.close()


async def test_a_dtls_handshake_that_stalls_is_dropped(no_leaked_tasks: None) -> None:
    async with dtls_server(handshake_timeout_s=0.3) as (listener, port):
        client = DtlsClient(("127.0.0.1", port))
        try:
            await returned_cookie(client, port)
            await eventually(lambda: len(listener.sessions) == 1, "session started")
            await eventually(lambda: not listener.sessions, "stalled session dropped")
            assert listener.sources.counts == {}
            assert limits_moved(listener) == {"handshake_timeout": 1}
        finally:
            client.sock.close()


async def test_a_dtls_session_without_a_first_message_is_dropped(no_leaked_tasks: None) -> None:
    async with dtls_server(first_message_timeout_s=0.3) as (listener, port):
        client = DtlsClient(("127.0.0.1", port))
        try:
            await client.handshake()
            await eventually(lambda: listener.connections == 1, "session established")
            await eventually(lambda: not listener.sessions, "silent session dropped")
            assert listener.connections == 0
            assert limits_moved(listener) == {"first_message_timeout": 1}
        finally:
            client.sock.close()


async def test_a_trickle_before_allocating_is_closed_on_dtls_too(no_leaked_tasks: None) -> None:
    """A first message in time, then one tiny record every 0.1 s (about 40 bytes on the wire
    each, 400 B/s): under a 2000 B/s minimum the session is dropped before it allocates."""
    limits = {
        "first_message_timeout_s": 0.5,
        "preauth_window_s": 0.5,
        "preauth_min_bytes_per_s": 2000.0,
    }
    async with dtls_server(**limits) as (listener, port):
        client = DtlsClient(("127.0.0.1", port))
        try:
            await client.handshake()
            answer = await client.request(stun.Message(stun.Method.BINDING, stun.Class.REQUEST))
            assert answer.message_class == stun.Class.RESPONSE
            assert listener.connections == 1

            async def trickle() -> None:
                for _ in range(100):
                    client.conn.send(b"\x00")
                    await client.flush()
                    await asyncio.sleep(0.1)

            task = asyncio.create_task(trickle())
            try:
                await eventually(lambda: not listener.sessions, "trickling session dropped")
                assert limits_moved(listener) == {"preauth_trickle": 1}
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert listener.connections == 0
            assert listener.sources.counts == {}
        finally:
            client.sock.close()
