"""RFC 6062 decisions of the sans-IO engine: TCP allocations, Connect, ConnectionBind, timeouts."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioice import stun

from stunnerd.turn import effects as fx
from stunnerd.turn.engine import Policies, TurnEngine
from stunnerd.turn.policies import (
    AllowAllPeers,
    EphemeralAuthenticator,
    PredicatePeerPolicy,
    StaticAuthenticator,
    UserQuota,
)
from stunnerd.turn.tcp_connections import BIND_TIMEOUT_S, CONNECT_TIMEOUT_S
from support.stun import CONNECT, CONNECTION_ATTEMPT, CONNECTION_BIND, Reply, parse

pytestmark = pytest.mark.usefixtures("aioice_turn_attributes")

REALM = "stunner.l7mp.io"
RELAY_IP = "192.0.2.1"
PEER = ("198.51.100.9", 8080)
T0 = 1_000_000.0
TCP = 6 << 24
UDP = 17 << 24
ALLOCATE, REFRESH, CREATE_PERMISSION, CHANNEL_BIND = 0x3, 0x4, 0x8, 0x9


def make_engine(peers: Any = None, **kw: Any) -> TurnEngine:
    policies = Policies(
        StaticAuthenticator(REALM, "user1", "pass1"), peers or AllowAllPeers(), UserQuota()
    )
    return TurnEngine(
        relay_ip=RELAY_IP, nonce_secret=b"k" * 32, policies=policies, **{"stream": True, **kw}
    )


def deny_all() -> PredicatePeerPolicy:
    return PredicatePeerPolicy(lambda ip: False, lambda ip, port: False)


@dataclass
class Conn:
    """One scripted stream connection (control or data) to the engine."""

    engine: TurnEngine
    addr: tuple[str, int]
    nonce: bytes | None = None
    log: list[fx.Effect] = field(default_factory=list)
    username: str = "user1"
    password: str = "pass1"

    @property
    def key(self) -> bytes:
        return hashlib.md5(f"{self.username}:{REALM}:{self.password}".encode()).digest()

    def feed(self, method: int, attrs: dict[str, Any], now: float) -> list[fx.Effect]:
        msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))  # type: ignore[arg-type]
        if self.nonce is not None:
            msg.attributes.update({"USERNAME": self.username, "REALM": REALM, "NONCE": self.nonce})
            msg.add_message_integrity(self.key)
        effects = self.engine.handle_client(bytes(msg), self.addr, now)
        self.log.extend(effects)
        return effects

    def answers(self, effects: list[fx.Effect]) -> list[Reply]:
        return [
            parse(e.data)
            for e in effects
            if isinstance(e, fx.SendToClient) and e.client == self.addr
        ]

    def request(self, method: int, attrs: dict[str, Any], now: float = T0) -> Reply | None:
        """The answer, if the engine gave one at once; a 401 challenge is answered once."""
        replies = self.answers(self.feed(method, attrs, now))
        if replies and replies[0].error_code == 401 and self.nonce is None:
            self.nonce = replies[0].attributes["NONCE"]
            replies = self.answers(self.feed(method, attrs, now))
        return replies[0] if replies else None

    def allocate(self, transport: int = TCP, now: float = T0, **extra: Any) -> Reply:
        effects_before = len(self.log)
        reply = self.request(ALLOCATE, {"REQUESTED-TRANSPORT": transport, **extra}, now)
        opened = [e for e in self.log[effects_before:] if isinstance(e, fx.OpenRelay)]
        if reply is None:
            assert len(opened) == 1
            assert opened[0].tcp is (transport == TCP)
            (reply,) = self.answers(self.engine.relay_opened(self.addr, 50000, now))
        return reply


def control(engine: TurnEngine) -> Conn:
    conn = Conn(engine, ("203.0.113.7", 40000))
    assert conn.allocate().error_code is None
    return conn


def connect(conn: Conn, peer: tuple[str, int] = PEER, now: float = T0) -> int:
    """A Connect the edge carries out: the connection id it asked for."""
    assert conn.request(CONNECT, {"XOR-PEER-ADDRESS": peer}, now) is None
    ask = [e for e in conn.log if isinstance(e, fx.ConnectPeer) and e.peer == peer][-1]
    assert ask.client == conn.addr
    return ask.connection_id


def closes(effects: list[fx.Effect]) -> set[int]:
    return {e.connection_id for e in effects if isinstance(e, fx.ClosePeerConnection)}


# --------------------------------------------------------------------------- Allocate


@pytest.mark.parametrize(
    ("stream", "tcp_relays", "extra", "expected", "reason"),
    [
        (False, True, {}, 442, "TCP or TLS listener"),
        (True, False, {}, 442, "single worker"),
        (True, True, {"EVEN-PORT": 0x80}, 400, "EVEN-PORT"),
        (True, True, {"RESERVATION-TOKEN": b"t" * 8}, 400, "RESERVATION-TOKEN"),
        (True, True, {"REQUESTED-TRANSPORT": 1 << 24}, 442, "Unsupported"),
    ],
)
def test_tcp_allocate_is_refused_where_rfc_6062_cannot_be_served(
    stream: bool, tcp_relays: bool, extra: dict[str, Any], expected: int, reason: str
) -> None:
    engine = make_engine(stream=stream, tcp_relays=tcp_relays)
    conn = Conn(engine, ("203.0.113.7", 40000))
    reply = conn.request(ALLOCATE, {"REQUESTED-TRANSPORT": TCP, **extra})
    assert reply is not None
    assert reply.error_code == expected
    assert reason in reply.attributes["ERROR-CODE"][1]
    assert engine.allocation_count == 0
    assert not any(isinstance(e, fx.OpenRelay) for e in conn.log)


def test_tcp_allocate_on_a_stream_opens_a_tcp_relay() -> None:
    engine = make_engine()
    conn = Conn(engine, ("203.0.113.7", 40000))
    reply = conn.allocate()
    assert reply.attributes["XOR-RELAYED-ADDRESS"] == (RELAY_IP, 50000)
    assert engine.allocations[conn.addr].tcp


# --------------------------------------------------------------------------- Connect


def test_connect_is_answered_with_a_connection_id_once_the_edge_connected() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    (reply,) = conn.answers(engine.peer_connected(cid, T0 + 1))
    assert (reply.method, reply.klass) == (CONNECT, stun.Class.RESPONSE)
    assert reply.attributes["CONNECTION-ID"] == cid
    assert PEER[0] in engine.allocations[conn.addr].permissions  # Connect installs a permission


@pytest.mark.parametrize("connected", [False, True])
def test_a_second_connect_to_the_same_peer_gets_446(connected: bool) -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    if connected:
        engine.peer_connected(cid, T0)
    reply = conn.request(CONNECT, {"XOR-PEER-ADDRESS": PEER})
    assert reply is not None
    assert reply.error_code == 446
    other = conn.request(CONNECT, {"XOR-PEER-ADDRESS": (PEER[0], PEER[1] + 1)})
    assert other is None  # another port of the same IP is another peer


def test_connect_to_a_peer_no_route_admits_gets_403_and_no_connection() -> None:
    engine = make_engine(peers=deny_all())
    conn = control(engine)
    reply = conn.request(CONNECT, {"XOR-PEER-ADDRESS": PEER})
    assert reply is not None
    assert reply.error_code == 403
    assert not any(isinstance(e, fx.ConnectPeer) for e in conn.log)
    assert engine.allocations[conn.addr].permissions == {}


def test_connect_that_fails_gets_447_and_may_be_tried_again() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    (reply,) = conn.answers(engine.peer_connect_failed(cid, T0 + 1))
    assert reply.error_code == 447
    assert engine.tcp_connection_count == 0
    assert connect(conn, now=T0 + 2) != cid


def test_connect_still_pending_after_30_s_gets_447_and_the_attempt_is_closed() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    assert engine.next_deadline() == T0 + CONNECT_TIMEOUT_S
    assert engine.tick(T0 + CONNECT_TIMEOUT_S - 1) == []
    effects = engine.tick(T0 + CONNECT_TIMEOUT_S)
    assert closes(effects) == {cid}
    (reply,) = conn.answers(effects)
    assert reply.error_code == 447
    assert conn.answers(engine.peer_connected(cid, T0 + 31)) == []  # too late: closed
    assert engine.tcp_connection_count == 0


def test_connect_on_a_udp_allocation_gets_400_and_channel_bind_on_a_tcp_one_too() -> None:
    engine = make_engine()
    udp = Conn(engine, ("203.0.113.8", 40000))
    assert udp.allocate(UDP).error_code is None
    reply = udp.request(CONNECT, {"XOR-PEER-ADDRESS": PEER})
    assert reply is not None
    assert reply.error_code == 400
    tcp = control(engine)
    reply = tcp.request(CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": PEER})
    assert reply is not None
    assert reply.error_code == 400


def test_connect_without_an_allocation_gets_437() -> None:
    engine = make_engine()
    conn = Conn(engine, ("203.0.113.7", 40000))
    reply = conn.request(CONNECT, {"XOR-PEER-ADDRESS": PEER})
    assert reply is not None
    assert reply.error_code == 437


def test_connections_per_allocation_are_capped_with_508() -> None:
    engine = make_engine()
    engine.max_tcp_connections = 2
    conn = control(engine)
    connect(conn, (PEER[0], 1))
    connect(conn, (PEER[0], 2))
    reply = conn.request(CONNECT, {"XOR-PEER-ADDRESS": (PEER[0], 3)})
    assert reply is not None
    assert reply.error_code == 508
    assert engine.peer_arrived(conn.addr, (PEER[0], 4), T0) == (0, [])
    # the Connect and the incoming peer both count against the cap, and nothing else does
    moved = {limit: n for limit, n in engine.refusals.limit_counts() if n}
    assert moved == {"tcp_connections_per_allocation": 2}


# --------------------------------------------------------------------------- ConnectionBind


def test_connection_bind_on_a_new_connection_splices_it_to_the_peer_connection() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    engine.peer_connected(cid, T0)
    data = Conn(engine, ("203.0.113.7", 40001), nonce=conn.nonce)
    effects = data.feed(CONNECTION_BIND, {"CONNECTION-ID": cid}, T0 + 1)
    (reply,) = data.answers(effects)
    assert (reply.method, reply.klass) == (CONNECTION_BIND, stun.Class.RESPONSE)
    assert effects[-1] == fx.BindPeerConnection(data.addr, cid)
    assert engine.tick(T0 + BIND_TIMEOUT_S + 1) == []  # bound: no bind timeout any more
    again = Conn(engine, ("203.0.113.7", 40002), nonce=conn.nonce)
    second = again.request(CONNECTION_BIND, {"CONNECTION-ID": cid}, T0 + 2)
    assert second is not None
    assert second.error_code == 400  # already bound


@pytest.mark.parametrize("attrs", [{}, {"CONNECTION-ID": 999}], ids=["missing", "unknown"])
def test_connection_bind_with_a_missing_or_unknown_connection_id_gets_400(
    attrs: dict[str, Any],
) -> None:
    engine = make_engine()
    conn = control(engine)
    engine.peer_connected(connect(conn), T0)
    data = Conn(engine, ("203.0.113.7", 40001), nonce=conn.nonce)
    reply = data.request(CONNECTION_BIND, attrs)
    assert reply is not None
    assert reply.error_code == 400
    assert not any(isinstance(e, fx.BindPeerConnection) for e in data.log)


def test_connection_bind_signed_by_another_user_gets_441() -> None:
    auth = EphemeralAuthenticator(REALM, "secret")
    engine = TurnEngine(
        relay_ip=RELAY_IP,
        nonce_secret=b"k" * 32,
        policies=Policies(auth, AllowAllPeers(), UserQuota()),
        stream=True,
    )
    alice, bob = "2000000:alice", "2000000:bob"
    conn = Conn(engine, ("203.0.113.7", 40000), username=alice, password=auth.password(alice))
    assert conn.allocate().error_code is None
    cid = connect(conn)
    engine.peer_connected(cid, T0)
    data = Conn(engine, ("203.0.113.9", 40001), username=bob, password=auth.password(bob))
    reply = data.request(CONNECTION_BIND, {"CONNECTION-ID": cid})
    assert reply is not None
    assert reply.error_code == 441
    owner = Conn(engine, ("203.0.113.7", 40002), username=alice, password=auth.password(alice))
    reply = owner.request(CONNECTION_BIND, {"CONNECTION-ID": cid})
    assert reply is not None
    assert reply.error_code is None  # the refused attempt did not use the id up


def test_connection_bind_for_a_connection_still_connecting_gets_400() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    data = Conn(engine, ("203.0.113.7", 40001), nonce=conn.nonce)
    reply = data.request(CONNECTION_BIND, {"CONNECTION-ID": cid})
    assert reply is not None
    assert reply.error_code == 400


def test_connection_bind_on_the_control_connection_gets_400() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    engine.peer_connected(cid, T0)
    reply = conn.request(CONNECTION_BIND, {"CONNECTION-ID": cid})
    assert reply is not None
    assert reply.error_code == 400


def test_an_unbound_peer_connection_is_closed_after_30_s_and_its_id_expires() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    engine.peer_connected(cid, T0 + 5)
    assert closes(engine.tick(T0 + 5 + BIND_TIMEOUT_S - 1)) == set()
    assert closes(engine.tick(T0 + 5 + BIND_TIMEOUT_S)) == {cid}
    data = Conn(engine, ("203.0.113.7", 40001), nonce=conn.nonce)
    reply = data.request(CONNECTION_BIND, {"CONNECTION-ID": cid}, T0 + 40)
    assert reply is not None
    assert reply.error_code == 400


# --------------------------------------------------------------------------- incoming peers


def test_an_incoming_peer_needs_a_permission_then_gets_a_connection_attempt() -> None:
    engine = make_engine()
    conn = control(engine)
    assert engine.peer_arrived(conn.addr, PEER, T0) == (0, [])
    assert conn.request(CREATE_PERMISSION, {"XOR-PEER-ADDRESS": (PEER[0], 0)}) is not None
    cid, effects = engine.peer_arrived(conn.addr, PEER, T0)
    assert cid
    (attempt,) = conn.answers(effects)
    assert (attempt.method, attempt.klass) == (CONNECTION_ATTEMPT, stun.Class.INDICATION)
    assert attempt.attributes["XOR-PEER-ADDRESS"] == PEER
    assert attempt.attributes["CONNECTION-ID"] == cid
    data = Conn(engine, ("203.0.113.7", 40001), nonce=conn.nonce)
    reply = data.request(CONNECTION_BIND, {"CONNECTION-ID": cid}, T0 + 1)
    assert reply is not None
    assert reply.error_code is None


def test_an_incoming_peer_no_route_admits_is_refused_despite_a_permission() -> None:
    engine = make_engine()
    conn = control(engine)
    conn.request(CREATE_PERMISSION, {"XOR-PEER-ADDRESS": (PEER[0], 0)})
    engine.set_policies(
        Policies(StaticAuthenticator(REALM, "user1", "pass1"), deny_all(), UserQuota()), T0
    )
    assert engine.peer_arrived(conn.addr, PEER, T0) == (0, [])


# --------------------------------------------------------------------------- allocation end


def test_refresh_with_zero_lifetime_closes_every_peer_connection() -> None:
    engine = make_engine()
    conn = control(engine)
    first = connect(conn, (PEER[0], 1))
    second = connect(conn, (PEER[0], 2))
    engine.peer_connected(first, T0)
    effects = conn.feed(REFRESH, {"LIFETIME": 0}, T0 + 1)
    assert closes(effects) == {first, second}
    assert engine.tcp_connection_count == 0


def test_allocation_expiry_and_control_connection_close_close_peer_connections() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    engine.peer_connected(cid, T0)
    data = Conn(engine, ("203.0.113.7", 40001), nonce=conn.nonce)
    data.feed(CONNECTION_BIND, {"CONNECTION-ID": cid}, T0)
    assert closes(engine.client_closed(conn.addr, T0 + 2)) == {cid}
    other = Conn(engine, ("203.0.113.7", 40002))
    assert other.allocate(now=T0 + 3).error_code is None
    cid2 = connect(other, now=T0 + 3)
    engine.peer_connected(cid2, T0 + 3)
    data2 = Conn(engine, ("203.0.113.7", 40003), nonce=other.nonce)
    data2.feed(CONNECTION_BIND, {"CONNECTION-ID": cid2}, T0 + 4)
    assert closes(engine.tick(T0 + 3 + 600)) == {cid2}


def test_a_route_change_closes_connections_to_peers_no_longer_admitted() -> None:
    engine = make_engine()
    conn = control(engine)
    kept = connect(conn, ("10.1.2.3", 80))
    dropped = connect(conn, PEER)
    only_ten = PredicatePeerPolicy(
        lambda ip: ip.startswith("10."), lambda ip, port: ip.startswith("10.")
    )
    effects = engine.set_policies(
        Policies(StaticAuthenticator(REALM, "user1", "pass1"), only_ten, UserQuota()), T0 + 1
    )
    assert closes(effects) == {dropped}
    assert engine.tcp_connection_count == 1
    assert kept in {e.connection_id for e in conn.log if isinstance(e, fx.ConnectPeer)}


def test_the_edge_reporting_a_closed_connection_frees_its_peer_for_a_new_connect() -> None:
    engine = make_engine()
    conn = control(engine)
    cid = connect(conn)
    engine.peer_connected(cid, T0)
    assert engine.peer_connection_closed(cid, T0 + 1) == []
    assert connect(conn, now=T0 + 2) != cid
