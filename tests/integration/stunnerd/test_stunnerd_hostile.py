"""What clients that never authenticate may hold: connections per source, time, bandwidth.

Real sockets on loopback against an in-process server with small limits; the "attackers" bind
127.0.0.2 so that a real client on 127.0.0.1 is a different source.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator

import pytest
from aioice import stun
from aioice.turn import create_turn_endpoint
from fixtures.stunnerd.inproc import make_config

from stunner_common.config import StunnerConfig
from stunnerd.net.guard import ClientLimits, ConnectionLimits
from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.net.stream import StreamListener
from stunnerd.net.tuning import ServerTuning
from stunnerd.turn.guard import RequestLimits
from stunnerd.workers.local import LocalDataplane
from support.echo import echo_peer
from support.stunnerd_process import PASSWORD, USER

pytestmark = pytest.mark.integration

ATTACKER = "127.0.0.2"
WAIT_S = 10.0


@contextlib.asynccontextmanager
async def server_with(config: StunnerConfig, **connection: float) -> AsyncIterator[TurnServer]:
    limits = ClientLimits(RequestLimits(), ConnectionLimits(**connection))  # type: ignore[arg-type]
    dataplane = LocalDataplane(TurnServer(ServerOptions(bind_host="127.0.0.1", limits=limits)))
    try:
        await dataplane.reconciler.apply(config)
        yield dataplane.server
    finally:
        await dataplane.close()


def limits_moved(server: TurnServer) -> dict[str, int]:
    """The limits the only listener counted refusals by (`stunner_listener_limit_refusals`)."""
    (listener,) = server.listeners.values()
    return {limit: n for limit, n in listener.engine.refusals.limit_counts() if n}


def stream_listener(server: TurnServer) -> StreamListener:
    (listener,) = server.listeners.values()
    assert isinstance(listener, StreamListener)
    return listener


async def connect(
    port: int, source: str = ATTACKER
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server closed the connection (EOF or reset), within WAIT_S."""
    try:
        async with asyncio.timeout(WAIT_S):
            while await reader.read(4096):
                pass
    except ConnectionError:
        return True
    return True


async def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()
    for writer in writers:
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


class Collector(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.queue.put_nowait(data)


async def real_client_echoes(port: int) -> None:
    """aioice allocates over TCP from 127.0.0.1 and relays a few datagrams to an echo peer."""
    async with echo_peer() as (_peer, peer_addr):
        turn, collector = await create_turn_endpoint(
            Collector,
            server_addr=("127.0.0.1", port),
            username=USER,
            password=PASSWORD,
            transport="tcp",
        )
        try:
            for i in range(3):
                turn.sendto(f"ping {i}".encode(), peer_addr)
                async with asyncio.timeout(WAIT_S):
                    assert await collector.queue.get() == f"ping {i}".encode()
        finally:
            turn.close()
            async with asyncio.timeout(WAIT_S):
                await collector.closed


async def test_connections_over_the_per_source_cap_are_closed_at_once(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TCP",))
    port = config.listeners[0].port
    async with server_with(config, max_per_source=5, first_message_timeout_s=60) as server:
        listener = stream_listener(server)
        conns = [await connect(port) for _ in range(8)]
        try:
            extra = [reader for reader, _ in conns[5:]]
            assert all([await closed_by_server(reader) for reader in extra])
            assert listener.connections == 5
            assert listener.refused_connections == 3
            assert limits_moved(server) == {"connections_per_source": 3}
            assert listener.sources.counts == {ATTACKER: 5}
            await real_client_echoes(port)  # another source is not affected
        finally:
            await close_all([writer for _, writer in conns])
        async with asyncio.timeout(WAIT_S):
            while listener.sources.counts:  # noqa: ASYNC110 - the server sees the FINs
                await asyncio.sleep(0.01)
        assert listener.connections == 0


async def test_a_connection_that_sends_no_message_is_closed(no_leaked_tasks: None) -> None:
    config = make_config(("TURN-TCP",))
    async with server_with(config, first_message_timeout_s=0.3) as server:
        reader, writer = await connect(config.listeners[0].port)
        try:
            writer.write(b"\x00\x01\x00")  # three bytes of a header, never finished
            assert await closed_by_server(reader)
        finally:
            await close_all([writer])
        assert stream_listener(server).connections == 0
        assert limits_moved(server) == {"first_message_timeout": 1}


async def test_a_trickle_before_allocating_is_closed_and_an_allocation_is_exempt(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TCP",))
    port = config.listeners[0].port
    limits = {
        "first_message_timeout_s": 0.5,
        "preauth_window_s": 0.5,
        "preauth_min_bytes_per_s": 200.0,
    }
    async with server_with(config, **limits) as server:
        reader, writer = await connect(port)
        binding = bytes(stun.Message(stun.Method.BINDING, stun.Class.REQUEST))
        try:
            writer.write(binding)  # a complete first message in time ...
            assert await closed_while_trickling(reader, writer)  # ... then 10 bytes a second
        finally:
            await close_all([writer])
        assert limits_moved(server) == {"preauth_trickle": 1}
        # a client that allocated sends nothing for several windows and is still served
        async with echo_peer() as (_peer, peer_addr):
            turn, collector = await create_turn_endpoint(
                Collector, ("127.0.0.1", port), USER, PASSWORD, transport="tcp"
            )
            try:
                await asyncio.sleep(3 * limits["preauth_window_s"])  # idle on purpose
                turn.sendto(b"still here", peer_addr)
                async with asyncio.timeout(WAIT_S):
                    assert await collector.queue.get() == b"still here"
            finally:
                turn.close()
                async with asyncio.timeout(WAIT_S):
                    await collector.closed


async def closed_while_trickling(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bool:
    """Send 10 bytes a second until the server hangs up (True), within WAIT_S."""
    trickle = asyncio.create_task(_trickle(writer))
    try:
        return await closed_by_server(reader)
    finally:
        trickle.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await trickle


async def _trickle(writer: asyncio.StreamWriter) -> None:
    for _ in range(200):
        writer.write(b"\x00")
        await writer.drain()
        await asyncio.sleep(0.1)


async def test_an_oversized_stun_frame_closes_the_connection_before_it_is_buffered(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TCP",))
    async with server_with(config) as server:
        reader, writer = await connect(config.listeners[0].port)
        try:
            # an Allocate header announcing 60000 bytes: refused on the header alone
            writer.write(struct.pack("!HHI", 0x0003, 60000, 0x2112A442) + os.urandom(12))
            assert await closed_by_server(reader)
        finally:
            await close_all([writer])
        assert stream_listener(server).connections == 0
        assert limits_moved(server) == {"message_bytes": 1}


def idle_connections(port: int, count: int, socks: list[socket.socket]) -> None:
    """Start `count` connections from ATTACKER that will never say anything (into `socks`)."""
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        socks.append(sock)
        sock.setblocking(False)
        sock.bind((ATTACKER, 0))
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_500_idle_connections_neither_exhaust_fds_nor_stop_a_real_client(
    no_leaked_tasks: None,
) -> None:
    """Default per-source cap: the server keeps at most 64 of them; a client elsewhere allocates."""
    config = make_config(("TURN-TCP",))
    port = config.listeners[0].port
    async with server_with(config, first_message_timeout_s=60) as server:
        listener = stream_listener(server)
        before = open_fds()
        socks: list[socket.socket] = []
        try:
            idle_connections(port, 500, socks)
            async with asyncio.timeout(WAIT_S):
                while listener.connections + listener.refused_connections < 500:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert listener.connections == ConnectionLimits().max_per_source
            # ours: 500 client sockets; the server's: its 64 connections, nothing for the rest
            bound = 500 + listener.connections + 8
            async with asyncio.timeout(WAIT_S):
                while open_fds() - before > bound:  # noqa: ASYNC110 - aborts close next turn
                    await asyncio.sleep(0.01)
            await real_client_echoes(port)
        finally:
            for sock in socks:
                sock.close()


async def test_500_held_idle_connections_do_not_stop_a_real_client_and_time_out(
    no_leaked_tasks: None,
) -> None:
    """With the cap raised, all 500 are held; a real client is served; the deadline ends them."""
    config = make_config(("TURN-TCP",))
    port = config.listeners[0].port
    async with server_with(config, max_per_source=1000, first_message_timeout_s=3) as server:
        listener = stream_listener(server)
        socks: list[socket.socket] = []
        try:
            idle_connections(port, 500, socks)
            async with asyncio.timeout(WAIT_S):
                while listener.connections < 500:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            await real_client_echoes(port)
            async with asyncio.timeout(WAIT_S):
                while listener.connections:  # noqa: ASYNC110 - first-message deadline
                    await asyncio.sleep(0.05)
            assert listener.sources.counts == {}
            assert limits_moved(server) == {"first_message_timeout": 500}
        finally:
            for sock in socks:
                sock.close()


async def test_a_connection_idle_without_an_allocation_is_closed(no_leaked_tasks: None) -> None:
    """A first message, then silence past the idle timeout (no minimum rate is set)."""
    config = make_config(("TURN-TCP",))
    connection = ConnectionLimits(preauth_min_bytes_per_s=0)
    tuning = ServerTuning(client_idle_timeout_s=0.3)
    server = TurnServer(
        ServerOptions(
            bind_host="127.0.0.1", limits=ClientLimits(connection=connection), tuning=tuning
        )
    )
    dataplane = LocalDataplane(server)
    try:
        await dataplane.reconciler.apply(config)
        reader, writer = await connect(config.listeners[0].port)
        try:
            assert (await binding_over(reader, writer)).message_class == stun.Class.RESPONSE
            assert await closed_by_server(reader)
        finally:
            await close_all([writer])
        assert limits_moved(server) == {"idle_timeout": 1}
    finally:
        await dataplane.close()


def client_tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def binding_over(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> stun.Message:
    request = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
    writer.write(bytes(request))
    async with asyncio.timeout(WAIT_S):
        head = await reader.readexactly(20)
        body = await reader.readexactly(int.from_bytes(head[2:4], "big"))
    answer = stun.parse_message(head + body)
    assert answer.transaction_id == request.transaction_id
    return answer


async def test_half_open_tls_connections_count_against_the_cap_before_their_handshake(
    no_leaked_tasks: None,
) -> None:
    """N+1 connections that never send a ClientHello: the last is closed at once, the N wait
    for the handshake deadline, and a client from elsewhere completes its handshake meanwhile."""
    cap = 3
    config = make_config(("TURN-TLS",))
    port = config.listeners[0].port
    async with server_with(config, max_per_source=cap, handshake_timeout_s=30) as server:
        listener = stream_listener(server)
        half_open = [await connect(port) for _ in range(cap + 1)]
        try:
            async with asyncio.timeout(WAIT_S):
                while listener.refused_connections < 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert listener.sources.counts == {ATTACKER: cap}
            assert limits_moved(server) == {"connections_per_source": 1}
            closed = [
                reader.at_eof() or await closed_by_server(reader) for reader, _ in half_open[cap:]
            ]
            assert closed == [True]
            assert listener.connections == 0  # none of them is through a handshake
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_tls(), local_addr=("127.0.0.1", 0)
            )
            try:
                await binding_over(reader, writer)
                assert listener.connections == 1
            finally:
                await close_all([writer])
        finally:
            await close_all([w for _, w in half_open])


async def test_a_tls_handshake_that_never_starts_is_closed_at_its_deadline(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-TLS",))
    async with server_with(config, handshake_timeout_s=0.3) as server:
        listener = stream_listener(server)
        reader, writer = await connect(config.listeners[0].port)
        try:
            assert await closed_by_server(reader)
            async with asyncio.timeout(WAIT_S):
                while listener.sources.counts:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert limits_moved(server) == {"handshake_timeout": 1}
        finally:
            await close_all([writer])


async def test_a_trickle_before_allocating_is_closed_on_tls_too(no_leaked_tasks: None) -> None:
    config = make_config(("TURN-TLS",))
    limits = {
        "first_message_timeout_s": 0.5,
        "preauth_window_s": 0.5,
        "preauth_min_bytes_per_s": 200.0,
    }
    async with server_with(config, **limits) as server:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1",
            config.listeners[0].port,
            ssl=client_tls(),
            local_addr=(ATTACKER, 0),
        )
        try:
            await binding_over(reader, writer)  # a complete first message in time ...
            assert await closed_while_trickling(reader, writer)  # ... then 10 bytes a second
        finally:
            await close_all([writer])
        listener = stream_listener(server)
        async with asyncio.timeout(WAIT_S):
            while listener.connections or listener.sources.counts:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert limits_moved(server) == {"preauth_trickle": 1}


@pytest.mark.parametrize("fastpath", [False, True])
async def test_a_udp_datagram_over_the_read_limit_is_dropped_even_on_a_bound_channel(
    no_leaked_tasks: None, fastpath: bool
) -> None:
    from fixtures.stunnerd.client import UdpTurnClient

    from stunnerd import fastpath as c_relay

    if fastpath and not c_relay.available():
        pytest.skip("stunnerd._fastpath is not built")
    config = make_config()
    limits = ClientLimits(RequestLimits(max_udp_datagram_bytes=2048))
    tuning = ServerTuning(fastpath=fastpath)
    dataplane = LocalDataplane(
        TurnServer(ServerOptions(bind_host="127.0.0.1", limits=limits, tuning=tuning))
    )
    try:
        await dataplane.reconciler.apply(config)
        async with (
            echo_peer() as (peer, peer_addr),
            UdpTurnClient(("127.0.0.1", config.listeners[0].port)) as client,
        ):
            await client.allocate()
            bound = await client.request(
                stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer_addr}
            )
            assert bound.message_class == stun.Class.RESPONSE
            frame = b"\x40\x00" + (2048).to_bytes(2, "big") + bytes(2048)  # 2052 bytes
            client.send_raw(frame)
            assert await client.nothing_arrives()
            fits = b"\x40\x00" + (2044).to_bytes(2, "big") + bytes(2044)  # 2048 bytes
            client.send_raw(fits)
            assert await client.recv_raw() == fits
            assert peer.received == 1
        assert limits_refused(dataplane) == {"udp_datagram_bytes": 1}
    finally:
        await dataplane.close()


def limits_refused(dataplane: LocalDataplane) -> dict[str, int]:
    """The limits the only listener counted refusals by, as the metrics read them (what the C
    relay dropped included)."""
    (listener,) = dataplane.stats().listeners
    return {limit: n for limit, n in listener.limit_refusals if n}


@pytest.mark.parametrize("fastpath", [False, True])
async def test_a_stun_message_over_the_size_limit_is_dropped_and_counted(
    no_leaked_tasks: None, fastpath: bool
) -> None:
    from stunnerd import fastpath as c_relay

    if fastpath and not c_relay.available():
        pytest.skip("stunnerd._fastpath is not built")
    config = make_config()
    limits = ClientLimits(RequestLimits(max_message_bytes=600))
    tuning = ServerTuning(fastpath=fastpath)
    dataplane = LocalDataplane(
        TurnServer(ServerOptions(bind_host="127.0.0.1", limits=limits, tuning=tuning))
    )
    try:
        await dataplane.reconciler.apply(config)
        big = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
        big.attributes["SOFTWARE"] = "x" * 700
        small = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.bind((ATTACKER, 0))
            server = ("127.0.0.1", config.listeners[0].port)
            await loop.sock_sendto(sock, bytes(big), server)
            await loop.sock_sendto(sock, bytes(small), server)
            async with asyncio.timeout(WAIT_S):
                answer = stun.parse_message(await loop.sock_recv(sock, 2048))
        assert answer.transaction_id == small.transaction_id  # the big one got no answer
        assert limits_refused(dataplane) == {"message_bytes": 1}
    finally:
        await dataplane.close()


@pytest.mark.parametrize("fastpath", [False, True])
async def test_a_source_over_its_challenge_budget_is_not_challenged_whoever_answers(
    no_leaked_tasks: None, fastpath: bool
) -> None:
    """401s (answered in C where it runs) and 438s (always the engine's) spend one budget per
    source; over it the source gets nothing, counted as the `challenge_rate` limit, while
    another source is still challenged."""
    from stunnerd import fastpath as c_relay

    if fastpath and not c_relay.available():
        pytest.skip("stunnerd._fastpath is not built")
    config = make_config()
    limits = ClientLimits(RequestLimits(challenge_rate_per_s=0.001, challenge_burst=2))
    tuning = ServerTuning(fastpath=fastpath)
    dataplane = LocalDataplane(
        TurnServer(ServerOptions(bind_host="127.0.0.1", limits=limits, tuning=tuning))
    )
    server = ("127.0.0.1", config.listeners[0].port)
    loop = asyncio.get_running_loop()

    def unsigned() -> bytes:
        request = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
        request.attributes["REQUESTED-TRANSPORT"] = 17 << 24
        return bytes(request)

    def stale(realm: str) -> bytes:
        request = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
        request.attributes.update(
            {"REQUESTED-TRANSPORT": 17 << 24, "USERNAME": USER, "REALM": realm}
        )
        request.attributes["NONCE"] = b"A" * 24  # not one this listener minted: 438
        request.add_message_integrity(os.urandom(16))
        return bytes(request)

    async def answer_code(sock: socket.socket, request: bytes) -> int | None:
        await loop.sock_sendto(sock, request, server)
        try:
            async with asyncio.timeout(0.5):
                return int(
                    stun.parse_message(await loop.sock_recv(sock, 2048)).attributes["ERROR-CODE"][0]
                )
        except TimeoutError:
            return None

    try:
        await dataplane.reconciler.apply(config)
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other,
        ):
            for sock, host in ((attacker, ATTACKER), (other, "127.0.0.3")):
                sock.setblocking(False)
                sock.bind((host, 0))
            assert await answer_code(attacker, unsigned()) == 401
            assert await answer_code(attacker, stale(config.auth.realm)) == 438
            assert await answer_code(attacker, unsigned()) is None
            assert await answer_code(attacker, stale(config.auth.realm)) is None
            assert await answer_code(other, unsigned()) == 401
        assert limits_refused(dataplane) == {"challenge_rate": 2}
    finally:
        await dataplane.close()
