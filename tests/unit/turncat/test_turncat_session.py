"""TurnSession against a scripted in-memory TURN server: auth, errors, retransmission, teardown.

The fake carrier hands each request to a script that answers (or stays silent) the way a TURN
server would; nothing touches a socket.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest
from aioice import stun

from stunner_common.auth import long_term_key
from stunner_common.stun import Method
from turncat.carrier import FrameSink, TlsOptions
from turncat.errors import (
    EXIT_PEER_CONNECT_FAILED,
    EXIT_UNSUPPORTED,
    AuthFailedError,
    PeerConnectFailedError,
    PeerForbiddenError,
    TurnError,
    UnreachableError,
    UnsupportedError,
)
from turncat.session import PeerTransport, TurnSession
from turncat.settings import TurncatSettings
from turncat.wire import parse_stun

REALM = "stunner.l7mp.io"
USER, PASSWORD = "user1", "passwd1"
KEY = long_term_key(USER, REALM, PASSWORD)
PEER = ("10.0.0.5", 5000)
RELAY = ("10.1.1.1", 40000)

Reply = stun.Message | None


class FakeServer:
    """Answers requests like a TURN server with long-term auth; `overrides` change one method."""

    def __init__(self) -> None:
        self.requests: list[stun.Message] = []
        self.nonce = b"nonce-1"
        self.overrides: dict[stun.Method, Callable[[stun.Message], Reply]] = {}
        self.sink: FrameSink | None = None
        self.closed = False
        self.changed = asyncio.Event()

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    def reply(self, req: stun.Message, cls: stun.Class, **attrs: Any) -> stun.Message:
        resp = stun.Message(req.message_method, cls, req.transaction_id, attributes=attrs)
        return resp

    def error(self, req: stun.Message, code: int, reason: str, **attrs: Any) -> stun.Message:
        return self.reply(req, stun.Class.ERROR, **{"ERROR-CODE": (code, reason), **attrs})

    def handle(self, req: stun.Message) -> Reply:
        self.requests.append(req)
        self.changed.set()
        if req.message_method in self.overrides:
            return self.overrides[req.message_method](req)
        return self.default(req)

    def default(self, req: stun.Message) -> Reply:
        if "USERNAME" not in req.attributes:
            return self.error(req, 401, "Unauthorized", REALM=REALM, NONCE=self.nonce)
        if req.attributes["NONCE"] != self.nonce:
            return self.error(req, 438, "Stale Nonce", REALM=REALM, NONCE=self.nonce)
        key = long_term_key(req.attributes["USERNAME"], REALM, PASSWORD)
        if not req.check_message_integrity(key):
            return self.error(req, 401, "Unauthorized", REALM=REALM, NONCE=self.nonce)
        attrs: dict[str, Any] = {}
        if req.message_method == stun.Method.ALLOCATE:
            attrs = {"XOR-RELAYED-ADDRESS": RELAY, "LIFETIME": 600}
        resp = self.reply(req, stun.Class.RESPONSE, **attrs)
        resp.add_message_integrity(KEY)
        return resp

    def methods(self) -> list[str]:
        return [r.message_method.name for r in self.requests]


class FakeCarrier:
    def __init__(self, server: FakeServer, sink: FrameSink, reliable: bool) -> None:
        self.server = server
        self.sink = sink
        self.reliable = reliable
        self.data: list[bytes] = []

    def send(self, frame: bytes) -> None:
        if frame[0] & 0xC0 == 0x40:
            self.data.append(frame)
            return
        req = parse_stun(frame)  # knows the RFC 6062 methods aioice does not
        assert req is not None
        resp = self.server.handle(req)  # type: ignore[arg-type]
        if resp is not None:
            out = bytes(resp)
            asyncio.get_running_loop().call_soon(self.sink.frame_received, out)

    def close(self) -> None:
        self.server.closed = True


def make_session(
    server: FakeServer,
    *,
    password: str = PASSWORD,
    reliable: bool = False,
    received: list[bytes] | None = None,
    connected: asyncio.Event | None = None,
    peer: tuple[str, int] = PEER,
    peer_transport: PeerTransport = "udp",
    **settings: Any,
) -> tuple[TurnSession, list[FakeCarrier]]:
    carriers: list[FakeCarrier] = []

    async def opener(
        transport: Any, addr: tuple[str, int], sink: FrameSink, tls: TlsOptions, timeout_s: float
    ) -> FakeCarrier:
        if connected is not None:
            await connected.wait()
        carrier = FakeCarrier(server, sink, reliable)
        carriers.append(carrier)
        return carrier

    sink = received if received is not None else []
    session = TurnSession(
        transport="udp",
        server=("192.0.2.1", 3478),
        peer=peer,
        peer_transport=peer_transport,
        credentials=lambda: (USER, password),
        tls=TlsOptions(),
        settings=TurncatSettings(**{"initial_rto_s": 0.01, "request_timeout_s": 1.0, **settings}),
        on_data=sink.append,
        opener=opener,
    )
    return session, carriers


async def test_open_allocates_permits_and_binds_after_the_auth_challenge(
    no_leaked_tasks: None,
) -> None:
    server = FakeServer()
    session, _ = make_session(server)
    await session.open()
    try:
        assert server.methods() == ["ALLOCATE", "ALLOCATE", "CREATE_PERMISSION", "CHANNEL_BIND"]
        assert session.relayed_address == RELAY
        allocate = server.requests[1]
        assert allocate.attributes["REQUESTED-TRANSPORT"] == 17 << 24
        bind = server.requests[3]
        assert bind.attributes["XOR-PEER-ADDRESS"] == PEER
        assert bind.attributes["CHANNEL-NUMBER"] == 0x4000
    finally:
        await session.close()
    assert server.requests[-1].message_method == stun.Method.REFRESH
    assert server.requests[-1].attributes["LIFETIME"] == 0
    assert server.closed


async def test_send_wraps_payload_in_channel_data_padded_on_streams(no_leaked_tasks: None) -> None:
    for reliable, expected in ((False, b"\x40\x00\x00\x03abc"), (True, b"\x40\x00\x00\x03abc\0")):
        session, carriers = make_session(FakeServer(), reliable=reliable)
        await session.open()
        session.send(b"abc")
        await session.close()
        session.send(b"after close is dropped")
        assert carriers[0].data == [expected]


async def test_only_our_channel_and_our_peer_reach_the_client(no_leaked_tasks: None) -> None:
    received: list[bytes] = []
    session, _ = make_session(FakeServer(), received=received)
    await session.open()
    try:
        session.frame_received(b"\x40\x00\x00\x02hi\x00\x00")
        session.frame_received(b"\x40\x01\x00\x05other")
        for peer, payload in ((PEER, b"peer data"), (("10.0.0.6", 5000), b"stranger")):
            ind = stun.Message(stun.Method.DATA, stun.Class.INDICATION)
            ind.attributes["XOR-PEER-ADDRESS"] = peer
            ind.attributes["DATA"] = payload
            session.frame_received(bytes(ind))
        session.frame_received(b"\x00\x01garbage")
        session.frame_received(b"\x40\x00\x00\x09short")
    finally:
        await session.close()
    assert received == [b"hi", b"peer data"]
    assert session.dropped == 4


async def test_wrong_password_is_an_auth_failure(no_leaked_tasks: None) -> None:
    server = FakeServer()
    session, _ = make_session(server, password="wrong")
    with pytest.raises(
        AuthFailedError, match=re.escape("rejected user 'user1' in realm 'stunner.l7mp.io'")
    ):
        await session.open()
    assert server.methods() == ["ALLOCATE", "ALLOCATE"]
    assert server.closed


async def test_stale_nonce_is_retried_with_the_fresh_nonce(no_leaked_tasks: None) -> None:
    server = FakeServer()
    original = server.default

    def rotate_then_answer(req: stun.Message) -> Reply:
        if req.message_method == stun.Method.CREATE_PERMISSION and server.nonce == b"nonce-1":
            server.nonce = b"nonce-2"
        return original(req)

    server.overrides[stun.Method.CREATE_PERMISSION] = rotate_then_answer
    session, _ = make_session(server)
    await session.open()
    await session.close()
    perms = [r for r in server.requests if r.message_method == stun.Method.CREATE_PERMISSION]
    assert [p.attributes["NONCE"] for p in perms] == [b"nonce-1", b"nonce-2"]


@pytest.mark.parametrize("method", [stun.Method.CREATE_PERMISSION, stun.Method.CHANNEL_BIND])
async def test_forbidden_peer_is_reported_as_such(
    no_leaked_tasks: None, method: stun.Method
) -> None:
    server = FakeServer()
    server.overrides[method] = lambda req: server.error(req, 403, "Forbidden")
    session, _ = make_session(server)
    with pytest.raises(PeerForbiddenError, match=r"peer 10\.0\.0\.5:5000 is not allowed"):
        await session.open()
    # The allocation made before the refusal is deleted again.
    assert server.requests[-1].message_method == stun.Method.REFRESH


async def test_other_errors_name_method_and_code(no_leaked_tasks: None) -> None:
    server = FakeServer()
    server.overrides[stun.Method.ALLOCATE] = lambda req: server.error(req, 486, "Quota Reached")
    session, _ = make_session(server)
    with pytest.raises(TurnError, match="ALLOCATE failed: 486 Quota Reached") as info:
        await session.open()
    assert info.value.code == 486


async def test_lost_requests_are_retransmitted_on_udp(no_leaked_tasks: None) -> None:
    server = FakeServer()
    drops = {"n": 2}

    def lossy(req: stun.Message) -> Reply:
        if drops["n"]:
            drops["n"] -= 1
            return None
        return server.default(req)

    server.overrides[stun.Method.ALLOCATE] = lossy
    session, _ = make_session(server)
    await session.open()
    await session.close()
    assert server.methods()[:4] == ["ALLOCATE"] * 4
    # Retransmissions reuse the transaction id.
    assert server.requests[0].transaction_id == server.requests[2].transaction_id


async def test_silent_server_is_unreachable_after_the_request_timeout(
    no_leaked_tasks: None,
) -> None:
    server = FakeServer()
    server.overrides[stun.Method.ALLOCATE] = lambda req: None
    session, _ = make_session(server, request_timeout_s=0.1)
    with pytest.raises(UnreachableError, match=re.escape("did not answer ALLOCATE within 0.1 s")):
        await session.open()


async def test_forged_response_fails_the_integrity_check(no_leaked_tasks: None) -> None:
    server = FakeServer()

    def forged(req: stun.Message) -> Reply:
        resp = server.reply(req, stun.Class.RESPONSE)
        resp.add_message_integrity(b"not the key")
        return resp if "USERNAME" in req.attributes else server.default(req)

    server.overrides[stun.Method.ALLOCATE] = forged
    session, _ = make_session(server)
    with pytest.raises(AuthFailedError, match="integrity"):
        await session.open()


async def test_refresh_timers_refresh_allocation_permission_and_channel(
    no_leaked_tasks: None,
) -> None:
    server = FakeServer()
    session, _ = make_session(server, allocation_refresh_s=0.02, permission_refresh_s=0.03)
    await session.open()
    try:
        await server.wait_until(
            lambda: (
                server.methods().count("REFRESH") >= 2
                and server.methods().count("CHANNEL_BIND") >= 3
            )
        )
    finally:
        await session.close()
    methods = server.methods()
    assert methods.count("CREATE_PERMISSION") >= 3
    refreshes = [r for r in server.requests if r.message_method == stun.Method.REFRESH]
    assert all(r.attributes["LIFETIME"] == 600 for r in refreshes[:-1])
    assert refreshes[-1].attributes["LIFETIME"] == 0


async def test_failed_refresh_reports_the_session_lost(no_leaked_tasks: None) -> None:
    server = FakeServer()
    lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
    session, _ = make_session(server, allocation_refresh_s=0.02)
    session._on_lost = lambda exc: lost.set_result(exc)
    server.overrides[stun.Method.REFRESH] = lambda req: server.error(req, 437, "Mismatch")
    await session.open()
    async with asyncio.timeout(5):
        exc = await lost
    assert isinstance(exc, TurnError)
    assert exc.code == 437
    assert not session.is_open
    await session.close()


async def test_close_while_opening_leaves_no_allocation_behind(no_leaked_tasks: None) -> None:
    server = FakeServer()
    connected = asyncio.Event()
    session, _ = make_session(server, connected=connected)
    opening = asyncio.create_task(session.open(), name="opening")
    await asyncio.sleep(0)
    await session.close()
    connected.set()
    with pytest.raises(UnreachableError, match="closed while opening"):
        await opening
    assert server.requests[-1].message_method == stun.Method.REFRESH
    assert server.requests[-1].attributes["LIFETIME"] == 0
    assert server.closed
    assert not session.is_open


async def test_ipv6_peer_asks_for_an_ipv6_relay(no_leaked_tasks: None) -> None:
    server = FakeServer()
    session, _ = make_session(server, peer=("fd00::5", 5000))
    await session.open()
    await session.close()
    allocate = server.requests[1]
    assert allocate.attributes["REQUESTED-ADDRESS-FAMILY"] == 0x02  # RFC 8656 §18.11
    assert server.requests[3].attributes["XOR-PEER-ADDRESS"] == ("fd00::5", 5000)
    ipv4, _ = make_session(server := FakeServer())
    await ipv4.open()
    await ipv4.close()
    assert "REQUESTED-ADDRESS-FAMILY" not in server.requests[1].attributes


async def test_tcp_peer_allocates_a_tcp_relay_and_binds_no_channel(no_leaked_tasks: None) -> None:
    server = FakeServer()
    session, _ = make_session(server, reliable=True, peer_transport="tcp")
    await session.open()
    await session.close()
    assert server.methods() == ["ALLOCATE", "ALLOCATE", "CREATE_PERMISSION", "REFRESH"]
    assert server.requests[1].attributes["REQUESTED-TRANSPORT"] == 6 << 24  # RFC 6062 §6.1


@pytest.mark.parametrize(
    ("code", "reason", "text"),
    [
        (447, "Connection Timeout or Failure", "could not connect to it"),
        (446, "Connection Already Exists", "already has a connection to it"),
    ],
)
async def test_failed_connect_names_the_peer_and_the_code(
    no_leaked_tasks: None, code: int, reason: str, text: str
) -> None:
    server = FakeServer()
    server.overrides[Method.CONNECT] = lambda req: server.error(req, code, reason)  # type: ignore[index]
    session, _ = make_session(server, reliable=True, peer_transport="tcp")
    await session.open()
    try:
        with pytest.raises(PeerConnectFailedError, match=f"10.0.0.5:5000.*{text}.*{code}") as info:
            await session.connect()
    finally:
        await session.close()
    assert info.value.exit_code == EXIT_PEER_CONNECT_FAILED
    connect = next(r for r in server.requests if int(r.message_method) == Method.CONNECT)
    assert connect.attributes["XOR-PEER-ADDRESS"] == PEER


async def test_connect_forbidden_by_the_server_is_a_forbidden_peer(no_leaked_tasks: None) -> None:
    server = FakeServer()
    server.overrides[Method.CONNECT] = lambda req: server.error(req, 403, "Forbidden")  # type: ignore[index]
    session, _ = make_session(server, reliable=True, peer_transport="tcp")
    await session.open()
    try:
        with pytest.raises(PeerForbiddenError, match="CONNECT: 403"):
            await session.connect()
    finally:
        await session.close()


@pytest.mark.parametrize(
    ("code", "reason", "peer", "peer_transport", "wanted"),
    [
        (442, "Unsupported Transport Protocol", PEER, "tcp", "a TCP relay"),
        (440, "Address Family not Supported", ("fd00::5", 5000), "udp", "an IPv6 relay"),
    ],
)
async def test_relay_the_server_does_not_offer_is_unsupported(
    no_leaked_tasks: None,
    code: int,
    reason: str,
    peer: tuple[str, int],
    peer_transport: PeerTransport,
    wanted: str,
) -> None:
    server = FakeServer()
    server.overrides[stun.Method.ALLOCATE] = lambda req: (
        server.error(req, code, reason) if "USERNAME" in req.attributes else server.default(req)
    )
    session, _ = make_session(server, peer=peer, peer_transport=peer_transport)
    with pytest.raises(UnsupportedError, match=f"does not offer {wanted}.*{code}") as info:
        await session.open()
    assert info.value.exit_code == EXIT_UNSUPPORTED
