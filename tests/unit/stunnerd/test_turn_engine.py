"""The sans-IO TURN engine driven by scripted clients and peers, with explicit `now` values."""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioice import stun

from stunnerd.handoff.transport.records import record_of
from stunnerd.net.adopt import allocation_of
from stunnerd.turn import effects as fx
from stunnerd.turn.allocation import (
    CHANNEL_LIFETIME_S,
    DEFAULT_LIFETIME_S,
    PERMISSION_LIFETIME_S,
    AllocationState,
)
from stunnerd.turn.engine import Policies, TurnEngine
from stunnerd.turn.guard import RequestLimits
from stunnerd.turn.policies import (
    AllowAllPeers,
    EphemeralAuthenticator,
    NoAuthenticator,
    PredicatePeerPolicy,
    StaticAuthenticator,
    UserQuota,
    UserUsage,
)

# The scripted client is aioice, an independent encoder; it needs TURN's extra attributes.
pytestmark = pytest.mark.usefixtures("aioice_turn_attributes")

REALM = "stunner.l7mp.io"
RELAY_IP = "192.0.2.1"
PEER = ("10.0.0.5", 7000)
T0 = 1_000_000.0


def static_policies(quota: int = 0, peers: Any = None) -> Policies:
    return Policies(
        StaticAuthenticator(REALM, "user1", "pass1"), peers or AllowAllPeers(), UserQuota(quota)
    )


def make_engine(policies: Policies | None = None, **kw: Any) -> TurnEngine:
    return TurnEngine(
        relay_ip=RELAY_IP,
        nonce_secret=b"k" * 32,
        policies=policies or static_policies(),
        **kw,
    )


def sent(effects: list[fx.Effect], client: tuple[str, int]) -> list[bytes]:
    return [e.data for e in effects if isinstance(e, fx.SendToClient) and e.client == client]


@dataclass
class Client:
    """A scripted TURN client speaking through `engine.handle_client`."""

    engine: TurnEngine
    addr: tuple[str, int] = ("203.0.113.7", 40000)
    username: str = "user1"
    password: str = "pass1"
    nonce: bytes | None = None
    realm: str | None = None
    next_port: int = 50000
    log: list[fx.Effect] = field(default_factory=list)

    @property
    def key(self) -> bytes:
        text = f"{self.username}:{self.realm or REALM}:{self.password}"
        return hashlib.md5(text.encode()).digest()

    def build(self, method: stun.Method, attrs: dict[str, Any], *, sign: bool = True) -> bytes:
        msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))
        if sign and self.nonce is not None:
            msg.attributes.update(
                {"USERNAME": self.username, "REALM": self.realm, "NONCE": self.nonce}
            )
            msg.add_message_integrity(self.key)
        return bytes(msg)

    def exchange(self, raw: bytes, now: float) -> stun.Message | None:
        effects = self.engine.handle_client(raw, self.addr, now)
        self.log.extend(effects)
        if any(isinstance(e, fx.OpenRelay) and e.client == self.addr for e in effects):
            effects = self.engine.relay_opened(self.addr, self.next_port, now)
            self.log.extend(effects)
        answers = sent(effects, self.addr)
        if not answers:
            return None
        assert len(answers) == 1
        return stun.parse_message(answers[0])

    def request(
        self, method: stun.Method, attrs: dict[str, Any] | None = None, now: float = T0
    ) -> stun.Message:
        """Send a request, answering a 401/438 challenge once as real clients do."""
        reply = self.exchange(self.build(method, attrs or {}), now)
        assert reply is not None
        if reply.message_class == stun.Class.ERROR and (
            (reply.error_code == 401 and self.nonce is None) or reply.error_code == 438
        ):
            self.nonce = reply.attributes["NONCE"]
            self.realm = reply.attributes["REALM"]
            reply = self.exchange(self.build(method, attrs or {}), now)
            assert reply is not None
        return reply

    def allocate(self, now: float = T0, **attrs: Any) -> stun.Message:
        base = {"REQUESTED-TRANSPORT": 17 << 24}
        base.update({k.replace("_", "-").upper(): v for k, v in attrs.items()})
        return self.request(stun.Method.ALLOCATE, base, now)


def code(reply: stun.Message) -> int | None:
    return reply.error_code


def routes(effects: list[fx.Effect]) -> list[fx.Effect]:
    return [e for e in effects if isinstance(e, fx.ChannelRouteAdded | fx.ChannelRouteRemoved)]


# --------------------------------------------------------------------------- STUN binding


def test_binding_request_is_answered_without_credentials_with_xor_mapped_address() -> None:
    engine = make_engine(Policies(NoAuthenticator(), AllowAllPeers(), UserQuota()))
    client = Client(engine)
    reply = client.exchange(client.build(stun.Method.BINDING, {}, sign=False), T0)
    assert reply is not None
    assert reply.message_class == stun.Class.RESPONSE
    assert reply.attributes["XOR-MAPPED-ADDRESS"] == client.addr
    assert "FINGERPRINT" in reply.attributes
    assert reply.attributes["SOFTWARE"] == "stunnerd"


# --------------------------------------------------------------------------- authentication


def test_first_allocate_gets_401_with_realm_and_nonce_and_no_allocation() -> None:
    engine = make_engine()
    client = Client(engine)
    reply = client.exchange(client.build(stun.Method.ALLOCATE, {}, sign=False), T0)
    assert reply is not None
    assert code(reply) == 401
    assert reply.attributes["REALM"] == REALM
    assert reply.attributes["NONCE"]
    assert engine.allocation_count == 0
    assert not any(isinstance(e, fx.OpenRelay) for e in client.log)


def test_allocate_with_credentials_succeeds_and_reports_relay_lifetime_and_mapped_address() -> None:
    engine = make_engine()
    client = Client(engine)
    reply = client.allocate()
    assert reply.message_class == stun.Class.RESPONSE
    assert reply.attributes["XOR-RELAYED-ADDRESS"] == (RELAY_IP, 50000)
    assert reply.attributes["XOR-MAPPED-ADDRESS"] == client.addr
    assert reply.attributes["LIFETIME"] == DEFAULT_LIFETIME_S
    assert reply.check_message_integrity(client.key)
    assert engine.allocation_count == 1
    created = [e for e in client.log if isinstance(e, fx.AllocationCreated)]
    assert created == [fx.AllocationCreated(client.addr, "user1", (RELAY_IP, 50000), 600)]


def test_wrong_password_gets_401_and_no_allocation() -> None:
    engine = make_engine()
    client = Client(engine, password="wrong")
    reply = client.allocate()
    assert code(reply) == 401
    assert engine.allocation_count == 0


def test_unknown_username_gets_401() -> None:
    client = Client(make_engine(), username="mallory")
    assert code(client.allocate()) == 401


def test_signed_request_missing_nonce_gets_400() -> None:
    engine = make_engine()
    client = Client(engine)
    msg = stun.Message(
        stun.Method.ALLOCATE,
        stun.Class.REQUEST,
        attributes={"REQUESTED-TRANSPORT": 17 << 24, "USERNAME": "user1", "REALM": REALM},
    )
    msg.add_message_integrity(client.key)
    reply = client.exchange(bytes(msg), T0)
    assert reply is not None
    assert code(reply) == 400


def test_nonce_older_than_its_lifetime_gets_438_with_a_fresh_nonce() -> None:
    engine = make_engine(nonce_lifetime_s=100.0)
    client = Client(engine)
    assert client.allocate().message_class == stun.Class.RESPONSE
    old_nonce = client.nonce
    raw = client.build(stun.Method.REFRESH, {})
    reply = client.exchange(raw, T0 + 150)
    assert reply is not None
    assert code(reply) == 438
    assert reply.attributes["NONCE"] != old_nonce
    # the client retries with the new nonce and succeeds
    reply = client.request(stun.Method.REFRESH, {}, T0 + 150)
    assert reply.message_class == stun.Class.RESPONSE


def test_forged_nonce_gets_438() -> None:
    client = Client(make_engine())
    client.allocate()
    client.nonce = b"0" * 40
    reply = client.exchange(client.build(stun.Method.REFRESH, {}), T0)
    assert reply is not None
    assert code(reply) == 438


def test_auth_type_none_refuses_turn_methods_with_400() -> None:
    engine = make_engine(Policies(NoAuthenticator(), AllowAllPeers(), UserQuota()))
    client = Client(engine)
    reply = client.exchange(client.build(stun.Method.ALLOCATE, {}, sign=False), T0)
    assert reply is not None
    assert code(reply) == 400
    assert engine.allocation_count == 0


def ephemeral_engine() -> tuple[TurnEngine, EphemeralAuthenticator]:
    auth = EphemeralAuthenticator(REALM, "s3cret")
    return make_engine(Policies(auth, AllowAllPeers(), UserQuota())), auth


def test_ephemeral_username_within_its_window_allocates_for_the_user_id() -> None:
    engine, auth = ephemeral_engine()
    username = f"{int(T0) + 3600}:alice"
    client = Client(engine, username=username, password=auth.password(username))
    assert client.allocate().message_class == stun.Class.RESPONSE
    assert engine.allocations[client.addr].user_id == "alice"


def test_expired_ephemeral_username_gets_401() -> None:
    engine, auth = ephemeral_engine()
    username = f"{int(T0) - 1}:alice"
    client = Client(engine, username=username, password=auth.password(username))
    assert code(client.allocate()) == 401
    assert engine.allocation_count == 0


def test_ephemeral_expiry_uses_the_wall_clock_offset() -> None:
    engine, auth = ephemeral_engine()
    engine.clock_offset_s = 10_000.0  # monotonic now + offset = unix time
    username = f"{int(T0) + 100}:bob"
    client = Client(engine, username=username, password=auth.password(username))
    assert code(client.allocate()) == 401


# --------------------------------------------------------------------------- allocate errors


def test_second_allocate_from_same_five_tuple_gets_437() -> None:
    client = Client(make_engine())
    client.allocate()
    client.next_port = 50002
    assert code(client.allocate()) == 437


def test_retransmitted_allocate_gets_the_same_answer() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()
    raw = client.build(stun.Method.REFRESH, {"LIFETIME": 900})
    first = sent(engine.handle_client(raw, client.addr, T0 + 1), client.addr)
    again = sent(engine.handle_client(raw, client.addr, T0 + 2), client.addr)
    assert first == again


def test_retransmission_of_the_successful_allocate_is_not_a_mismatch() -> None:
    engine = make_engine()
    first = Client(engine)
    first.allocate()
    client = Client(engine, addr=("203.0.113.8", 1), nonce=first.nonce, realm=first.realm)
    raw = client.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
    effects = engine.handle_client(raw, client.addr, T0)
    assert any(isinstance(e, fx.OpenRelay) for e in effects)
    answer = sent(engine.relay_opened(client.addr, 50000, T0), client.addr)
    again = sent(engine.handle_client(raw, client.addr, T0 + 1), client.addr)
    assert answer == again
    assert stun.parse_message(again[0]).message_class == stun.Class.RESPONSE


def test_retransmission_while_the_relay_is_opening_is_dropped() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()  # learn the nonce
    engine.handle_client(client.build(stun.Method.REFRESH, {"LIFETIME": 0}), client.addr, T0)
    raw = client.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
    assert any(isinstance(e, fx.OpenRelay) for e in engine.handle_client(raw, client.addr, T0))
    assert engine.handle_client(raw, client.addr, T0) == []


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({}, 400),
        ({"REQUESTED-TRANSPORT": 6 << 24}, 442),
        ({"REQUESTED-TRANSPORT": 17 << 24, "REQUESTED-ADDRESS-FAMILY": 2}, 440),
        ({"REQUESTED-TRANSPORT": 17 << 24, "REQUESTED-ADDRESS-FAMILY": 9}, 440),
        ({"REQUESTED-TRANSPORT": 17 << 24, "RESERVATION-TOKEN": b"12345678"}, 508),
        (
            {"REQUESTED-TRANSPORT": 17 << 24, "RESERVATION-TOKEN": b"12345678", "EVEN-PORT": 0},
            400,
        ),
    ],
)
def test_allocate_errors(attrs: dict[str, Any], expected: int) -> None:
    engine = make_engine()
    client = Client(engine)
    reply = client.request(stun.Method.ALLOCATE, attrs)
    assert code(reply) == expected
    assert reply.check_message_integrity(client.key)
    assert engine.allocation_count == 0


def test_allocate_asks_for_an_even_port_when_even_port_is_present() -> None:
    engine = make_engine()
    client = Client(engine)
    client.request(stun.Method.BINDING)
    reply = client.exchange(client.build(stun.Method.ALLOCATE, {}, sign=False), T0)
    assert reply is not None
    client.nonce, client.realm = reply.attributes["NONCE"], reply.attributes["REALM"]
    raw = client.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "EVEN-PORT": 0x80})
    opens = [e for e in engine.handle_client(raw, client.addr, T0) if isinstance(e, fx.OpenRelay)]
    assert opens == [fx.OpenRelay(client.addr, 4, True, True, 0, user_id="user1", lifetime_s=600)]


def test_relay_socket_failure_answers_508() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()
    engine.handle_client(client.build(stun.Method.REFRESH, {"LIFETIME": 0}), client.addr, T0)
    raw = client.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
    engine.handle_client(raw, client.addr, T0 + 1)
    reply = stun.parse_message(sent(engine.relay_failed(client.addr, T0 + 1), client.addr)[0])
    assert code(reply) == 508
    assert engine.allocation_count == 0


def test_unknown_comprehension_required_attribute_gets_420_listing_it() -> None:
    engine = make_engine()
    client = Client(engine)
    raw = bytearray(client.build(stun.Method.BINDING, {}, sign=False))
    raw[2:4] = (8).to_bytes(2, "big")
    raw += b"\x00\x1a\x00\x00" + b"\x7f\xff\x00\x00"  # DONT-FRAGMENT and 0x7FFF, both unknown
    reply = client.exchange(bytes(raw), T0)
    assert reply is not None
    assert code(reply) == 420
    assert reply.attributes["UNKNOWN-ATTRIBUTES"] == (0x001A, 0x7FFF)


def test_quota_refuses_an_allocation_beyond_the_user_limit_with_486() -> None:
    usage = UserUsage()
    engine = make_engine(static_policies(quota=1), usage=usage)
    first = Client(engine, addr=("203.0.113.7", 1))
    second = Client(engine, addr=("203.0.113.7", 2))
    assert first.allocate().message_class == stun.Class.RESPONSE
    assert code(second.allocate()) == 486
    first.request(stun.Method.REFRESH, {"LIFETIME": 0})
    assert usage.counts == {}
    assert second.allocate(T0 + 1).message_class == stun.Class.RESPONSE


def test_quota_is_shared_between_engines_of_one_process() -> None:
    usage = UserUsage()
    one = make_engine(static_policies(quota=1), usage=usage)
    two = make_engine(static_policies(quota=1), usage=usage)
    assert Client(one).allocate().message_class == stun.Class.RESPONSE
    assert code(Client(two).allocate()) == 486


# --------------------------------------------------------------------------- refresh and expiry


def test_refresh_with_zero_lifetime_deletes_allocation_and_closes_relay() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()
    reply = client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    assert reply.message_class == stun.Class.RESPONSE
    assert reply.attributes["LIFETIME"] == 0
    assert engine.allocation_count == 0
    assert fx.CloseRelay(client.addr) in client.log


def test_refresh_lifetime_is_clamped_to_the_maximum() -> None:
    client = Client(make_engine())
    client.allocate()
    assert client.request(stun.Method.REFRESH, {"LIFETIME": 99999}).attributes["LIFETIME"] == 3600
    assert client.request(stun.Method.REFRESH, {"LIFETIME": 5}).attributes["LIFETIME"] == 600


def test_refresh_without_allocation_gets_437() -> None:
    client = Client(make_engine())
    assert code(client.request(stun.Method.REFRESH, {})) == 437


def test_refresh_with_mismatched_address_family_gets_443() -> None:
    client = Client(make_engine())
    client.allocate()
    assert code(client.request(stun.Method.REFRESH, {"REQUESTED-ADDRESS-FAMILY": 2})) == 443


def test_allocation_expires_after_its_lifetime_unless_refreshed() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()
    assert engine.next_deadline() is not None
    assert engine.tick(T0 + DEFAULT_LIFETIME_S - 1) == []
    client.request(stun.Method.REFRESH, {}, T0 + 500)
    assert not any(isinstance(e, fx.AllocationDeleted) for e in engine.tick(T0 + 700))
    effects = engine.tick(T0 + 500 + DEFAULT_LIFETIME_S)
    assert fx.AllocationDeleted(client.addr, "user1", "expired") in effects
    assert fx.CloseRelay(client.addr) in effects
    assert engine.allocation_count == 0


def test_stream_client_close_deletes_its_allocation() -> None:
    engine = make_engine(stream=True)
    client = Client(engine)
    client.allocate()
    effects = engine.client_closed(client.addr, T0 + 1)
    assert fx.CloseRelay(client.addr) in effects
    assert engine.allocation_count == 0


# --------------------------------------------------------------------------- permissions and data


def allocated(peers: Any = None, **kw: Any) -> tuple[TurnEngine, Client]:
    engine = make_engine(static_policies(peers=peers), **kw)
    client = Client(engine)
    assert client.allocate().message_class == stun.Class.RESPONSE
    return engine, client


def send_indication(peer: tuple[str, int], data: bytes) -> bytes:
    msg = stun.Message(
        stun.Method.SEND, stun.Class.INDICATION, attributes={"XOR-PEER-ADDRESS": peer, "DATA": data}
    )
    return bytes(msg)


def test_send_indication_without_permission_is_dropped() -> None:
    engine, client = allocated()
    assert engine.handle_client(send_indication(PEER, b"hi"), client.addr, T0) == []


def test_create_permission_then_send_and_data_indications_flow_both_ways() -> None:
    engine, client = allocated()
    reply = client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": PEER})
    assert reply.message_class == stun.Class.RESPONSE
    effects = engine.handle_client(send_indication(PEER, b"hello"), client.addr, T0 + 1)
    assert effects == [fx.SendToPeer(client.addr, PEER, b"hello")]
    back = sent(engine.handle_peer(client.addr, PEER, b"world", T0 + 2), client.addr)
    data = stun.parse_message(back[0])
    assert data.message_method == stun.Method.DATA
    assert data.message_class == stun.Class.INDICATION
    assert data.attributes["XOR-PEER-ADDRESS"] == PEER
    assert data.attributes["DATA"] == b"world"


def test_data_from_a_peer_without_permission_is_dropped() -> None:
    engine, client = allocated()
    assert engine.handle_peer(client.addr, PEER, b"x", T0) == []


def test_permission_expires_after_300_seconds() -> None:
    engine, client = allocated()
    client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": PEER})
    engine.tick(T0 + PERMISSION_LIFETIME_S)
    assert engine.handle_client(send_indication(PEER, b"x"), client.addr, T0 + 301) == []
    assert engine.handle_peer(client.addr, PEER, b"x", T0 + 301) == []


def test_permission_is_per_ip_so_other_ports_of_the_peer_may_send() -> None:
    engine, client = allocated()
    client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": PEER})
    other = (PEER[0], 9999)
    assert engine.handle_client(send_indication(other, b"x"), client.addr, T0) == [
        fx.SendToPeer(client.addr, other, b"x")
    ]


def test_create_permission_carrying_several_peers_installs_all() -> None:
    engine, client = allocated()
    tid = b"multi-peer-1"
    second = ("10.0.0.6", 1)
    attrs = [
        (0x0012, stun.pack_xor_address(PEER, tid)),
        (0x0012, stun.pack_xor_address(second, tid)),
        (0x0006, client.username.encode()),
        (0x0014, (client.realm or "").encode()),
        (0x0015, client.nonce or b""),
    ]
    body = b"".join(_attr(kind, value) for kind, value in attrs)
    head = b"\x00\x08" + (len(body) + 24).to_bytes(2, "big") + b"\x21\x12\xa4\x42" + tid
    data = head + body
    data += _attr(0x0008, stun.message_integrity(data, client.key))
    effects = engine.handle_client(data, client.addr, T0)
    assert stun.parse_message(sent(effects, client.addr)[0]).message_class == stun.Class.RESPONSE
    assert set(engine.allocations[client.addr].permissions) == {PEER[0], second[0]}


def _attr(kind: int, value: bytes) -> bytes:
    return kind.to_bytes(2, "big") + len(value).to_bytes(2, "big") + value + bytes(-len(value) % 4)


def test_create_permission_without_peer_gets_400() -> None:
    _, client = allocated()
    assert code(client.request(stun.Method.CREATE_PERMISSION, {})) == 400


def test_create_permission_for_ipv6_peer_on_ipv4_relay_gets_443() -> None:
    _, client = allocated()
    reply = client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": ("2001:db8::1", 1)})
    assert code(reply) == 443


def only_10_0_0_0_slash_24_ports_7000_7999() -> PredicatePeerPolicy:
    return PredicatePeerPolicy(
        lambda ip: ip.startswith("10.0.0."),
        lambda ip, port: ip.startswith("10.0.0.") and 7000 <= port <= 7999,
    )


def test_disallowed_peer_gets_403_on_create_permission_and_channel_bind() -> None:
    engine, client = allocated(peers=only_10_0_0_0_slash_24_ports_7000_7999())
    bad = ("198.51.100.1", 7000)
    assert code(client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": bad})) == 403
    reply = client.request(
        stun.Method.CHANNEL_BIND, {"XOR-PEER-ADDRESS": bad, "CHANNEL-NUMBER": 0x4000}
    )
    assert code(reply) == 403
    assert engine.allocations[client.addr].permissions == {}


def test_admitted_ip_with_port_outside_range_gets_permission_but_no_data() -> None:
    engine, client = allocated(peers=only_10_0_0_0_slash_24_ports_7000_7999())
    outside = ("10.0.0.5", 8000)
    reply = client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": outside})
    assert reply.message_class == stun.Class.RESPONSE
    assert engine.handle_client(send_indication(outside, b"x"), client.addr, T0) == []
    assert engine.handle_peer(client.addr, outside, b"x", T0) == []
    assert engine.handle_client(send_indication(PEER, b"x"), client.addr, T0) != []


def test_channel_bind_to_an_admitted_ip_on_a_port_outside_every_range_gets_403() -> None:
    engine, client = allocated(peers=only_10_0_0_0_slash_24_ports_7000_7999())
    outside = ("10.0.0.5", 8000)
    reply = client.request(
        stun.Method.CHANNEL_BIND, {"XOR-PEER-ADDRESS": outside, "CHANNEL-NUMBER": 0x4000}
    )
    assert code(reply) == 403
    alloc = engine.allocations[client.addr]
    assert alloc.channels == {}
    assert alloc.permissions == {}
    inside = ("10.0.0.5", 7500)
    reply = client.request(
        stun.Method.CHANNEL_BIND, {"XOR-PEER-ADDRESS": inside, "CHANNEL-NUMBER": 0x4000}
    )
    assert reply.message_class == stun.Class.RESPONSE
    assert 0x4000 in alloc.channels


# --------------------------------------------------------------------------- channels


def bind(client: Client, peer: tuple[str, int], number: int, now: float = T0) -> stun.Message:
    return client.request(
        stun.Method.CHANNEL_BIND, {"XOR-PEER-ADDRESS": peer, "CHANNEL-NUMBER": number}, now
    )


def test_channel_bind_routes_channel_data_both_ways() -> None:
    engine, client = allocated()
    assert bind(client, PEER, 0x4001).message_class == stun.Class.RESPONSE
    assert fx.ChannelRouteAdded(client.addr, 0x4001, PEER) in client.log
    frame = b"\x40\x01\x00\x05hello"
    assert engine.handle_client(frame, client.addr, T0) == [
        fx.SendToPeer(client.addr, PEER, b"hello")
    ]
    assert sent(engine.handle_peer(client.addr, PEER, b"abc", T0), client.addr) == [
        b"\x40\x01\x00\x03abc"
    ]


def test_channel_data_is_padded_to_four_bytes_on_stream_transports() -> None:
    engine, client = allocated(stream=True)
    bind(client, PEER, 0x4001)
    assert sent(engine.handle_peer(client.addr, PEER, b"abc", T0), client.addr) == [
        b"\x40\x01\x00\x03abc\x00"
    ]


def test_channel_data_on_unbound_channel_or_with_short_length_is_dropped() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    assert engine.handle_client(b"\x40\x02\x00\x01x", client.addr, T0) == []
    assert engine.handle_client(b"\x40\x01\x00\x09abc", client.addr, T0) == []
    assert engine.handle_client(b"\x40\x01", client.addr, T0) == []


@pytest.mark.parametrize("number", [0x3FFF, 0x8000, 0xFFFF])
def test_channel_bind_outside_the_channel_range_gets_400(number: int) -> None:
    _, client = allocated()
    assert code(bind(client, PEER, number)) == 400


def test_channel_bind_without_peer_gets_400() -> None:
    _, client = allocated()
    assert code(client.request(stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000})) == 400


def test_rebinding_a_channel_to_another_peer_or_a_peer_to_another_channel_gets_400() -> None:
    _, client = allocated()
    bind(client, PEER, 0x4001)
    assert code(bind(client, ("10.0.0.9", 1), 0x4001)) == 400
    assert code(bind(client, PEER, 0x4002)) == 400


def test_rebinding_the_same_channel_and_peer_refreshes_it() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    client.request(stun.Method.REFRESH, {}, T0 + 400)
    assert bind(client, PEER, 0x4001, T0 + 500).message_class == stun.Class.RESPONSE
    effects = engine.tick(T0 + CHANNEL_LIFETIME_S + 1)
    assert not any(isinstance(e, fx.ChannelRouteRemoved) for e in effects)


def test_channel_route_is_removed_when_the_permission_expires_and_restored_on_refresh() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    effects = engine.tick(T0 + PERMISSION_LIFETIME_S)
    assert routes(effects) == [fx.ChannelRouteRemoved(client.addr, 0x4001, PEER)]
    assert engine.handle_client(b"\x40\x01\x00\x01x", client.addr, T0 + 301) == []
    reply = client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": PEER}, T0 + 302)
    assert reply.message_class == stun.Class.RESPONSE
    assert fx.ChannelRouteAdded(client.addr, 0x4001, PEER) in client.log[-4:]


def test_channel_expires_after_600_seconds_without_refresh() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": PEER}, T0 + 299)
    client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": PEER}, T0 + 598)
    client.request(stun.Method.REFRESH, {}, T0 + 599)
    effects = engine.tick(T0 + CHANNEL_LIFETIME_S)
    assert routes(effects) == [fx.ChannelRouteRemoved(client.addr, 0x4001, PEER)]
    assert engine.allocations[client.addr].channels == {}


def test_swapping_the_peer_policy_removes_and_restores_routes_of_live_allocations() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    deny = PredicatePeerPolicy(lambda ip: False, lambda ip, port: False)
    removed = engine.set_policies(static_policies(peers=deny), T0 + 1)
    assert removed == [fx.ChannelRouteRemoved(client.addr, 0x4001, PEER)]
    assert engine.handle_peer(client.addr, PEER, b"x", T0 + 1) == []
    restored = engine.set_policies(static_policies(), T0 + 2)
    assert restored == [fx.ChannelRouteAdded(client.addr, 0x4001, PEER)]
    assert engine.allocation_count == 1


def test_new_credentials_apply_to_the_next_request_of_a_live_allocation() -> None:
    engine, client = allocated()
    new = Policies(StaticAuthenticator(REALM, "user1", "changed"), AllowAllPeers(), UserQuota())
    engine.set_policies(new, T0 + 1)
    assert code(client.request(stun.Method.REFRESH, {}, T0 + 2)) == 401
    client.password = "changed"
    assert client.request(stun.Method.REFRESH, {}, T0 + 3).message_class == stun.Class.RESPONSE


@pytest.mark.parametrize(
    "auth",
    [StaticAuthenticator(REALM, "user1", "changed"), StaticAuthenticator(REALM, "user2", "pass1")],
    ids=["password changed", "user replaced"],
)
def test_withdrawn_credentials_take_the_channels_out_of_the_offload_at_once(
    auth: StaticAuthenticator,
) -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    effects = engine.set_policies(Policies(auth, AllowAllPeers(), UserQuota()), T0 + 1)
    assert effects == [fx.ChannelRouteAdded(client.addr, 0x4001, PEER, offload=False)]
    assert engine.allocation_count == 1  # upstream: it relays until its next request fails
    assert engine.handle_peer(client.addr, PEER, b"x", T0 + 1) != []
    restored = engine.set_policies(static_policies(), T0 + 2)  # e.g. a rolled-back reconcile
    assert restored == [fx.ChannelRouteAdded(client.addr, 0x4001, PEER, offload=True)]
    assert engine.set_policies(static_policies(quota=3), T0 + 3) == []


def test_a_request_with_the_new_credentials_puts_the_channels_back_into_the_offload() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    new = Policies(StaticAuthenticator(REALM, "user1", "changed"), AllowAllPeers(), UserQuota())
    engine.set_policies(new, T0 + 1)
    client.password = "changed"
    assert client.request(stun.Method.REFRESH, {}, T0 + 2).message_class == stun.Class.RESPONSE
    assert fx.ChannelRouteAdded(client.addr, 0x4001, PEER, offload=True) in client.log[-3:]
    assert engine.set_policies(new, T0 + 3) == []


def test_a_new_turn_rest_secret_revokes_but_an_expired_username_does_not() -> None:
    engine, auth = ephemeral_engine()
    username = f"{int(T0) + 100}:alice"
    client = Client(engine, username=username, password=auth.password(username))
    assert client.allocate().message_class == stun.Class.RESPONSE
    bind(client, PEER, 0x4001)
    same = Policies(EphemeralAuthenticator(REALM, "s3cret"), AllowAllPeers(), UserQuota(7))
    assert engine.set_policies(same, T0 + 200) == []  # past the username's expiry: offloaded
    other = Policies(EphemeralAuthenticator(REALM, "rotated"), AllowAllPeers(), UserQuota())
    effects = engine.set_policies(other, T0 + 201)
    assert effects == [fx.ChannelRouteAdded(client.addr, 0x4001, PEER, offload=False)]


def test_an_allocation_goes_pending_active_revoked_active_and_is_gone_after_refresh_zero() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()  # learn the nonce
    client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    assert engine.state_of(client.addr) is None
    raw = client.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
    engine.handle_client(raw, client.addr, T0)
    assert engine.state_of(client.addr) is AllocationState.PENDING
    assert client.addr not in engine.allocations  # nothing relays before the relay is open
    engine.relay_opened(client.addr, 50001, T0)
    assert engine.state_of(client.addr) is AllocationState.ACTIVE
    revoking = Policies(
        StaticAuthenticator(REALM, "user1", "changed"), AllowAllPeers(), UserQuota()
    )
    engine.set_policies(revoking, T0 + 1)
    assert engine.state_of(client.addr) is AllocationState.REVOKED
    engine.set_policies(static_policies(), T0 + 2)
    assert engine.state_of(client.addr) is AllocationState.ACTIVE
    alloc = engine.allocations[client.addr]
    client.request(stun.Method.REFRESH, {"LIFETIME": 0}, T0 + 3)
    assert alloc.state is AllocationState.DELETED
    assert engine.state_of(client.addr) is None


def test_a_pending_allocate_of_a_client_that_left_is_aborted_and_its_relay_closed() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()
    client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    raw = client.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
    engine.handle_client(raw, client.addr, T0)
    assert engine.client_closed(client.addr, T0) == []
    assert engine.state_of(client.addr) is None
    assert engine.relay_opened(client.addr, 50001, T0) == [
        fx.CloseRelay(client.addr),
        fx.AllocationAborted(client.addr),
    ]


def test_another_user_cannot_refresh_someone_elses_allocation() -> None:
    auth = EphemeralAuthenticator(REALM, "s")
    engine = make_engine(Policies(auth, AllowAllPeers(), UserQuota()))
    alice = f"{int(T0) + 100}:alice"
    client = Client(engine, username=alice, password=auth.password(alice))
    client.allocate()
    bob = f"{int(T0) + 100}:bob"
    client.username, client.password = bob, auth.password(bob)
    assert code(client.request(stun.Method.REFRESH, {})) == 437
    fresh = f"{int(T0) + 999}:alice"
    client.username, client.password = fresh, auth.password(fresh)
    assert client.request(stun.Method.REFRESH, {}).message_class == stun.Class.RESPONSE


def test_close_drops_every_allocation_and_its_routes() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    effects = engine.close()
    assert fx.ChannelRouteRemoved(client.addr, 0x4001, PEER) in effects
    assert fx.CloseRelay(client.addr) in effects
    assert engine.allocation_count == 0


# --------------------------------------------------------------------------- garbage


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xff" * 40,
        b"\x00\x01\x00\x00" + b"\x00" * 16,  # wrong magic cookie
        b"\x00\x01\x00\x08\x21\x12\xa4\x42" + b"\x00" * 12,  # length beyond the datagram
        b"\x01\x01\x00\x00\x21\x12\xa4\x42" + b"\x00" * 12,  # a response
        b"\x00\x11\x00\x00\x21\x12\xa4\x42" + b"\x00" * 12,  # a binding indication
    ],
)
def test_garbage_is_dropped_silently(data: bytes) -> None:
    engine = make_engine()
    assert engine.handle_client(data, ("1.2.3.4", 5), T0) == []


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        (b"\x00\x01", 400),  # Binding: its attributes are scanned
        (b"\x00\x03", 401),  # Allocate without MESSAGE-INTEGRITY: challenged, never scanned
    ],
)
def test_request_with_truncated_attribute(method: bytes, expected: int) -> None:
    engine = make_engine()
    raw = method + b"\x00\x08\x21\x12\xa4\x42" + b"t" * 12 + b"\x00\x19\x00\x08\x11\x00\x00\x00"
    reply = stun.parse_message(
        sent(engine.handle_client(raw, ("1.2.3.4", 5), T0), ("1.2.3.4", 5))[0]
    )
    assert code(reply) == expected


def test_request_with_unknown_method_gets_400() -> None:
    engine = make_engine()
    raw = b"\x00\x0d\x00\x00\x21\x12\xa4\x42" + b"t" * 12
    (reply,) = sent(engine.handle_client(raw, ("1.2.3.4", 5), T0), ("1.2.3.4", 5))
    assert reply[:2] == b"\x01\x1d"  # error response to method 0x00D
    assert reply[8:20] == b"t" * 12
    assert b"\x00\x09\x00" in reply  # ERROR-CODE attribute
    assert b"\x00\x00\x04\x00" in reply  # class 4, number 0


def test_relay_opened_for_a_vanished_request_closes_the_relay() -> None:
    engine = make_engine()
    assert engine.relay_opened(("1.2.3.4", 5), 1234, T0) == [
        fx.CloseRelay(("1.2.3.4", 5)),
        fx.AllocationAborted(("1.2.3.4", 5)),
    ]


def test_channel_numbers_up_to_0x7fff_are_accepted_for_rfc5766_clients() -> None:
    _, client = allocated()
    assert bind(client, PEER, 0x7FFF).message_class == stun.Class.RESPONSE


def test_even_port_with_r_bit_reserves_the_next_port_for_a_token_holder() -> None:
    engine = make_engine()
    rtp = Client(engine, addr=("203.0.113.7", 1))
    rtp.allocate()  # learn a nonce; the first allocation is a plain one
    rtp.request(stun.Method.REFRESH, {"LIFETIME": 0})
    raw = rtp.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "EVEN-PORT": 0x80})
    opens = [e for e in engine.handle_client(raw, rtp.addr, T0) if isinstance(e, fx.OpenRelay)]
    assert opens == [fx.OpenRelay(rtp.addr, 4, True, True, 0, user_id="user1", lifetime_s=600)]
    answer = sent(engine.relay_opened(rtp.addr, 50000, T0, reserved_port=50001), rtp.addr)
    token = stun.parse_message(answer[0]).attributes["RESERVATION-TOKEN"]
    assert len(token) == 8

    rtcp = Client(engine, addr=("203.0.113.7", 2), nonce=rtp.nonce, realm=rtp.realm)
    raw = rtcp.build(
        stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "RESERVATION-TOKEN": token}
    )
    opens = [e for e in engine.handle_client(raw, rtcp.addr, T0) if isinstance(e, fx.OpenRelay)]
    assert opens == [
        fx.OpenRelay(rtcp.addr, 4, False, False, 50001, user_id="user1", lifetime_s=600)
    ]
    reply = stun.parse_message(sent(engine.relay_opened(rtcp.addr, 50001, T0), rtcp.addr)[0])
    assert reply.attributes["XOR-RELAYED-ADDRESS"] == (RELAY_IP, 50001)

    reuse = Client(engine, addr=("203.0.113.7", 3), nonce=rtp.nonce, realm=rtp.realm)
    reply = reuse.request(
        stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "RESERVATION-TOKEN": token}
    )
    assert code(reply) == 508


def test_an_unused_reservation_lapses_and_releases_its_port() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()
    client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    raw = client.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "EVEN-PORT": 0x80})
    engine.handle_client(raw, client.addr, T0)
    engine.relay_opened(client.addr, 50000, T0, reserved_port=50001)
    assert engine.tick(T0 + 29) == []
    assert fx.ReleasePort(50001) in engine.tick(T0 + 31)
    assert engine.reservations == {}


def test_deadlines_of_deleted_allocations_do_not_pile_up_under_churn() -> None:
    engine = make_engine()
    first = Client(engine)
    first.allocate()
    for i in range(3000):
        client = Client(engine, addr=("198.51.100.1", 1000 + i), nonce=first.nonce, realm=REALM)
        client.allocate()
        client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    assert engine.allocation_count == 1
    assert len(engine.table.deadlines) <= 1100
    assert engine.next_deadline() is not None
    assert fx.AllocationDeleted(first.addr, "user1", "expired") in engine.tick(T0 + 601)


# --------------------------------------------------------------------------- hostile input


def stuffed_allocate(count: int) -> bytes:
    """An unauthenticated Allocate carrying `count` XOR-PEER-ADDRESS attributes."""
    attrs = b"".join(
        b"\x00\x12\x00\x08" + struct.pack("!BBHI", 0, 1, 1 + i, 0x5E12A443) for i in range(count)
    )
    return struct.pack("!HHI", 0x0003, len(attrs), 0x2112A442) + b"t" * 12 + attrs


def test_a_datagram_over_the_size_limit_is_dropped_unread() -> None:
    engine = make_engine(limits=RequestLimits(max_message_bytes=1500))
    assert engine.handle_client(stuffed_allocate(5000), ("1.2.3.4", 5), T0) == []
    assert engine.stats_dropped == 1


def test_an_unsigned_request_is_challenged_whatever_it_carries() -> None:
    engine = make_engine()
    (answer,) = sent(
        engine.handle_client(stuffed_allocate(120), ("1.2.3.4", 5), T0), ("1.2.3.4", 5)
    )
    assert code(stun.parse_message(answer)) == 401


def test_a_signed_request_over_the_attribute_limit_gets_a_short_400() -> None:
    engine = make_engine(limits=RequestLimits(max_attributes=10))
    client = Client(engine)
    client.allocate()
    peers = {"XOR-PEER-ADDRESS": ("10.0.0.5", 7000)}
    raw = bytearray(client.build(stun.Method.CREATE_PERMISSION, peers))
    # eleven more attributes in front of MESSAGE-INTEGRITY: rebuild with a padded body
    extra = b"\x80\x22\x00\x04abcd" * 11
    body = bytes(raw[20:])
    forged = struct.pack("!HH", 0x0008, len(body) + len(extra)) + bytes(raw[4:20]) + extra + body
    reply = client.exchange(forged, T0)
    assert reply is not None
    assert code(reply) == 400
    assert "more than 10 attributes" in reply.attributes["ERROR-CODE"][1]
    assert len(bytes(reply)) < len(forged)


def test_challenges_per_source_ip_are_rate_limited_with_bounded_state() -> None:
    engine = make_engine(limits=RequestLimits(challenge_rate_per_s=1, challenge_burst=5))
    bare = b"\x00\x03\x00\x00\x21\x12\xa4\x42" + b"t" * 12
    answers = [
        sent(engine.handle_client(bare, ("1.2.3.4", p), T0), ("1.2.3.4", p)) for p in range(8)
    ]
    assert [len(a) for a in answers] == [1] * 5 + [0] * 3
    assert engine.stats_challenges_suppressed == 3
    assert sent(engine.handle_client(bare, ("1.2.3.5", 1), T0), ("1.2.3.5", 1))  # another source
    assert sent(engine.handle_client(bare, ("1.2.3.4", 9), T0 + 1.0), ("1.2.3.4", 9))  # refilled
    # a legitimate client that got its challenge still allocates: only challenges are limited
    client = Client(engine, addr=("1.2.3.6", 1))
    assert client.allocate(T0 + 1.0).message_class == stun.Class.RESPONSE


def test_a_401_to_a_bare_request_is_no_larger_than_coturns() -> None:
    """coturn 4.6 answers the same 20 bytes with 112 (bench hostile compares them live)."""
    engine = make_engine()
    bare = b"\x00\x03\x00\x00\x21\x12\xa4\x42" + b"t" * 12
    (answer,) = sent(engine.handle_client(bare, ("1.2.3.4", 5), T0), ("1.2.3.4", 5))
    assert len(answer) <= 112


def test_send_indications_from_a_client_without_allocation_are_dropped_undecoded() -> None:
    engine = make_engine()
    send = stun.Message(
        stun.Method.SEND, stun.Class.INDICATION, attributes={"XOR-PEER-ADDRESS": PEER, "DATA": b"x"}
    )
    assert engine.handle_client(bytes(send), ("1.2.3.4", 5), T0) == []
    assert engine.stats_dropped == 1


def test_unknown_attributes_in_a_signed_request_get_420_after_authentication() -> None:
    engine = make_engine()
    client = Client(engine)
    client.allocate()
    raw = client.build(stun.Method.REFRESH, {"LIFETIME": 600})
    body = raw[20:]
    extra = b"\x7f\xfe\x00\x00"
    forged = struct.pack("!HH", 0x0004, len(body) + len(extra)) + raw[4:20] + extra + body
    reply = client.exchange(forged, T0)
    assert reply is not None
    assert code(reply) == 401  # the integrity no longer matches: authentication comes first
    signed = stun.Message(stun.Method.REFRESH, stun.Class.REQUEST)
    signed.attributes.update({"USERNAME": "user1", "REALM": REALM, "NONCE": client.nonce})
    unsigned = bytes(signed)
    with_unknown = unsigned[:2] + struct.pack("!H", len(unsigned) - 20 + 4) + unsigned[4:] + extra
    digest = hmac.new(
        client.key,
        with_unknown[:2] + struct.pack("!H", len(with_unknown) - 20 + 24) + with_unknown[4:],
        hashlib.sha1,
    ).digest()
    final = (
        with_unknown[:2]
        + struct.pack("!H", len(with_unknown) - 20 + 24)
        + with_unknown[4:]
        + b"\x00\x08\x00\x14"
        + digest
    )
    reply = client.exchange(final, T0)
    assert reply is not None
    assert code(reply) == 420
    assert reply.attributes["UNKNOWN-ATTRIBUTES"] == (0x7FFE,)


# --------------------------------------------------------------------------- adoption


def adopted_copy(engine: TurnEngine, client: Client, now: float, **kw: Any) -> TurnEngine:
    """A fresh engine (a dead worker's replacement) that adopted `client`'s allocation from
    its journal record; the client talks to it from now on."""
    record = record_of(engine.allocations[client.addr], now)
    fresh = make_engine(**kw)
    assert fresh.adopt(allocation_of(record, now))
    client.engine = fresh
    return fresh


def test_an_adopted_allocation_carries_on_with_its_channel_lifetimes_and_quota() -> None:
    engine, client = allocated()
    assert bind(client, PEER, 0x4001).message_class == stun.Class.RESPONSE
    later = T0 + 10.0
    fresh = adopted_copy(engine, client, later, policies=static_policies(quota=1))
    assert fresh.state_of(client.addr) is AllocationState.ACTIVE
    # Nothing is routed until the edge has the relay open and asks for the routes.
    assert fresh.handle_client(b"\x40\x01\x00\x02hi", client.addr, later) == []
    assert routes(fresh.announce(client.addr, later)) == [
        fx.ChannelRouteAdded(client.addr, 0x4001, PEER)
    ]
    assert fresh.handle_client(b"\x40\x01\x00\x02hi", client.addr, later) == [
        fx.SendToPeer(client.addr, PEER, b"hi")
    ]
    # Requests go on under the nonce the client has (the key is shared): no 437.
    refresh = client.request(stun.Method.REFRESH, {"LIFETIME": 600}, later)
    assert refresh.message_class == stun.Class.RESPONSE
    assert bind(client, ("10.0.0.6", 7000), 0x4002, later).message_class == stun.Class.RESPONSE
    # The user's quota counts the adopted allocation.
    other = Client(fresh, addr=("203.0.113.8", 40001))
    assert code(other.allocate(later)) == 486
    # Lifetimes run from when they were granted, not from the adoption.
    expired = fresh.tick(T0 + PERMISSION_LIFETIME_S + 1)
    assert fx.ChannelRouteRemoved(client.addr, 0x4001, PEER) in expired
    assert not fresh.adopt(allocation_of(record_of(fresh.allocations[client.addr], later), later))


def test_an_adopted_allocation_whose_credentials_the_config_no_longer_grants_is_revoked() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    changed = Policies(StaticAuthenticator(REALM, "user1", "other"), AllowAllPeers(), UserQuota())
    fresh = adopted_copy(engine, client, T0, policies=changed)
    assert routes(fresh.announce(client.addr, T0)) == [
        fx.ChannelRouteAdded(client.addr, 0x4001, PEER, offload=False)
    ]
    assert fresh.state_of(client.addr) is AllocationState.REVOKED


def test_records_carry_seconds_left_and_drop_what_expired() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4001)
    record = record_of(engine.allocations[client.addr], T0 + 100)
    assert record.expires_in_s == DEFAULT_LIFETIME_S - 100
    assert record.permissions == {PEER[0]: PERMISSION_LIFETIME_S - 100}
    assert [(c.number, c.expires_in_s) for c in record.channels] == [
        (0x4001, CHANNEL_LIFETIME_S - 100)
    ]
    alloc = allocation_of(record, 5.0)
    assert alloc.expires == 5.0 + DEFAULT_LIFETIME_S - 100
    late = record_of(engine.allocations[client.addr], T0 + PERMISSION_LIFETIME_S + 1)
    assert late.permissions == {}
