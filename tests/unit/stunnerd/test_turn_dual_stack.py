"""Dual stack in the sans-IO engine: address families of allocations and peers (RFC 8656 §7.2,
§9, §11), dual allocations with ADDITIONAL-ADDRESS-FAMILY, IPv6 routes and IPv4-mapped peers."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import pytest
from aioice import stun

from stunner_common.config import parse_config
from stunnerd.protected import ProtectedRanges
from stunnerd.routing import policies_for
from stunnerd.turn import codec
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import Policies, TurnEngine
from stunnerd.turn.errors import TurnError
from stunnerd.turn.families import FamilyChoice, choose_families
from stunnerd.turn.policies import AllowAllPeers, PeerPolicy, StaticAuthenticator, UserQuota

pytestmark = pytest.mark.usefixtures("aioice_turn_attributes")

REALM = "stunner.l7mp.io"
T0 = 1_000_000.0
CLIENT = ("203.0.113.7", 40000)
IPV4, IPV6 = 0x01, 0x02


def engine(
    relay_ip: str = "192.0.2.1", other: str = "", peers: PeerPolicy | None = None
) -> TurnEngine:
    policies = Policies(
        StaticAuthenticator(REALM, "user1", "pass1"), peers or AllowAllPeers(), UserQuota()
    )
    return TurnEngine(
        relay_ip=relay_ip, other_relay_ip=other, nonce_secret=b"k" * 32, policies=policies
    )


def raw_attributes(data: bytes) -> list[tuple[int, bytes]]:
    """Every attribute of a message in order, repeated ones included (aioice keeps the last)."""
    out, pos = [], 20
    while pos + 4 <= len(data):
        kind, length = struct.unpack_from("!HH", data, pos)
        out.append((kind, data[pos + 4 : pos + 4 + length]))
        pos += 4 + length + (-length % 4)
    return out


class Client:
    """A scripted client: aioice builds the requests, the engine answers, the test opens relays."""

    def __init__(self, eng: TurnEngine, addr: tuple[str, int] = CLIENT) -> None:
        self.engine = eng
        self.addr = addr
        self.nonce: bytes | None = None
        self.key = hashlib.md5(f"user1:{REALM}:pass1".encode()).digest()
        self.opened: list[fx.OpenRelay] = []
        self.effects: list[fx.Effect] = []

    def raw(
        self, method: stun.Method, attrs: dict[str, Any], ports: tuple[int, int] = (50000, 50002)
    ) -> bytes:
        for _ in range(2):
            msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))
            if self.nonce is not None:
                msg.attributes.update({"USERNAME": "user1", "REALM": REALM, "NONCE": self.nonce})
                msg.add_message_integrity(self.key)
            effects = self.engine.handle_client(bytes(msg), self.addr, T0)
            for effect in effects:
                if isinstance(effect, fx.OpenRelay):
                    self.opened.append(effect)
                    extra = ports[1] if effect.additional_family else 0
                    effects += self.engine.relay_opened(self.addr, ports[0], T0, 0, extra)
            self.effects = effects
            answers = [e.data for e in effects if isinstance(e, fx.SendToClient)]
            assert len(answers) == 1, effects
            reply = stun.parse_message(answers[0])
            if (
                reply.message_class == stun.Class.ERROR
                and reply.error_code == 401
                and self.nonce is None
            ):
                self.nonce = reply.attributes["NONCE"]
                continue
            return answers[0]
        raise AssertionError("challenged twice")

    def request(self, method: stun.Method, attrs: dict[str, Any]) -> stun.Message:
        return stun.parse_message(self.raw(method, attrs))

    def allocate(self, **attrs: Any) -> bytes:
        base: dict[str, Any] = {"REQUESTED-TRANSPORT": 17 << 24}
        base.update({k.replace("_", "-").upper(): v for k, v in attrs.items()})
        return self.raw(stun.Method.ALLOCATE, base)

    def permit(self, peer: tuple[str, int]) -> int | None:
        reply = self.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": peer})
        return reply.error_code if reply.message_class == stun.Class.ERROR else None

    def bind(self, peer: tuple[str, int], number: int = 0x4000) -> int | None:
        reply = self.request(
            stun.Method.CHANNEL_BIND, {"XOR-PEER-ADDRESS": peer, "CHANNEL-NUMBER": number}
        )
        return reply.error_code if reply.message_class == stun.Class.ERROR else None


def relayed(answer: bytes) -> list[tuple[str, int]]:
    tid = answer[8:20]
    return [stun.unpack_xor_address(v, tid) for k, v in raw_attributes(answer) if k == 0x0016]


def error_of(answer: bytes) -> int | None:
    msg = stun.parse_message(answer)
    return msg.error_code if msg.message_class == stun.Class.ERROR else None


# ------------------------------------------------------------------ the family decision


@pytest.mark.parametrize(
    ("attrs", "families", "expected"),
    [
        ({}, {4}, FamilyChoice(4)),
        ({}, {6}, FamilyChoice(6)),
        ({"REQUESTED-ADDRESS-FAMILY": IPV6}, {4, 6}, FamilyChoice(6)),
        ({"REQUESTED-ADDRESS-FAMILY": IPV6}, {4}, 440),
        ({"REQUESTED-ADDRESS-FAMILY": 3}, {4, 6}, 440),
        ({"ADDITIONAL-ADDRESS-FAMILY": IPV6}, {4, 6}, FamilyChoice(4, additional=6)),
        ({"ADDITIONAL-ADDRESS-FAMILY": IPV6}, {4}, FamilyChoice(4, refused=6)),
        ({"ADDITIONAL-ADDRESS-FAMILY": IPV6}, {6}, 440),
    ],
)
def test_relay_families_follow_the_family_attributes(
    attrs: dict[str, Any], families: set[int], expected: FamilyChoice | int
) -> None:
    own = 6 if families == {6} else 4
    if isinstance(expected, FamilyChoice):
        assert choose_families(attrs, families, own) == expected
        return
    with pytest.raises(TurnError) as refused:
        choose_families(attrs, families, own)
    assert (refused.value.code, refused.value.reason) == (expected, "Address Family not Supported")


@pytest.mark.parametrize(
    "attrs",
    [
        {"ADDITIONAL-ADDRESS-FAMILY": IPV6, "REQUESTED-ADDRESS-FAMILY": IPV4},
        {"ADDITIONAL-ADDRESS-FAMILY": IPV6, "REQUESTED-ADDRESS-FAMILY": IPV6},
        {"ADDITIONAL-ADDRESS-FAMILY": IPV4},
        {"ADDITIONAL-ADDRESS-FAMILY": IPV6, "EVEN-PORT": 0x80},
        {"ADDITIONAL-ADDRESS-FAMILY": IPV6, "RESERVATION-TOKEN": b"12345678"},
    ],
)
def test_a_malformed_dual_allocate_gets_400_and_opens_nothing(attrs: dict[str, Any]) -> None:
    client = Client(engine(other="2001:db8::1"))
    assert error_of(client.allocate(**{k.replace("-", "_"): v for k, v in attrs.items()})) == 400
    assert client.opened == []
    assert client.engine.allocations == {}


# ------------------------------------------------------------------ allocations


def test_dual_allocate_answers_an_ipv4_and_an_ipv6_relayed_address() -> None:
    client = Client(engine(other="2001:db8::1"))
    answer = client.allocate(additional_address_family=IPV6)
    assert error_of(answer) is None
    assert client.opened[0].family == 4
    assert client.opened[0].additional_family == 6
    assert relayed(answer) == [("192.0.2.1", 50000), ("2001:db8::1", 50002)]
    alloc = client.engine.allocations[CLIENT]
    assert alloc.families == {4, 6}
    assert 0x8001 not in [k for k, _ in raw_attributes(answer)]


def test_dual_allocate_with_a_plain_even_port_asks_for_an_even_ipv4_relay() -> None:
    client = Client(engine(other="2001:db8::1"))
    assert error_of(client.allocate(additional_address_family=IPV6, even_port=0)) is None
    assert client.opened[0].even_port
    assert client.opened[0].additional_family == 6


def test_coturns_draft_codepoint_for_additional_address_family_is_understood() -> None:
    """coturn 4.6's uclient -Z sends 0x8032 (the dual-allocation draft's codepoint)."""
    client = Client(engine(other="2001:db8::1"))
    client.allocate()  # learn the nonce; the allocation is then deleted below
    client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    msg = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
    msg.attributes.update({"REQUESTED-TRANSPORT": 17 << 24})
    body = bytes(msg)[20:] + struct.pack("!HHB3x", 0x8032, 4, IPV6)
    data = bytes(msg)[:2] + struct.pack("!H", len(body)) + bytes(msg)[4:20] + body
    decoded = codec.decode(data)
    assert decoded.message.attributes["ADDITIONAL-ADDRESS-FAMILY"] == IPV6


def test_dual_allocate_without_an_ipv6_relay_address_gets_ipv4_and_address_error_440() -> None:
    client = Client(engine())
    answer = client.allocate(additional_address_family=IPV6)
    assert error_of(answer) is None
    assert relayed(answer) == [("192.0.2.1", 50000)]
    (value,) = [v for k, v in raw_attributes(answer) if k == 0x8001]
    assert codec.ATTRIBUTES_BY_NAME["ADDRESS-ERROR-CODE"][3](value) == (
        IPV6,
        440,
        "Address Family not Supported",
    )
    assert client.engine.allocations[CLIENT].families == {4}


def test_dual_allocate_on_an_ipv6_only_listener_gets_440() -> None:
    client = Client(engine("2001:db8::1"))
    assert error_of(client.allocate(additional_address_family=IPV6)) == 440
    assert client.opened == []


def test_requested_ipv6_family_takes_the_other_relay_address() -> None:
    client = Client(engine(other="2001:db8::1"))
    answer = client.allocate(requested_address_family=IPV6)
    assert relayed(answer) == [("2001:db8::1", 50000)]
    assert client.opened[0].family == 6
    assert Client(engine(), ("203.0.113.8", 1)).allocate(requested_address_family=IPV6)
    assert error_of(Client(engine()).allocate(requested_address_family=IPV6)) == 440


def test_an_ipv6_listener_relays_ipv6_and_refuses_ipv4_peers_with_443() -> None:
    client = Client(engine("::1"), ("::1", 40000))
    assert relayed(client.allocate()) == [("::1", 50000)]
    assert client.permit(("::1", 9000)) is None
    assert client.permit(("127.0.0.1", 9000)) == 443
    assert client.bind(("127.0.0.1", 9000)) == 443
    assert client.permit(("::ffff:127.0.0.1", 9000)) == 443  # an IPv4 peer in IPv6 clothing


def test_a_dual_allocation_permits_and_relays_peers_of_both_families() -> None:
    eng = engine(other="2001:db8::1")
    client = Client(eng)
    client.allocate(additional_address_family=IPV6)
    v4, v6 = ("10.0.0.5", 7000), ("2001:db8::77", 7000)
    assert client.permit(v4) is None
    assert client.bind(v6, 0x4001) is None
    assert set(eng.allocations[CLIENT].permissions) == {"10.0.0.5", "2001:db8::77"}
    for peer in (v4, v6):
        data = stun.Message(stun.Method.SEND, stun.Class.INDICATION)
        data.attributes.update({"XOR-PEER-ADDRESS": peer, "DATA": b"hi"})
        assert eng.handle_client(bytes(data), CLIENT, T0) == [fx.SendToPeer(CLIENT, peer, b"hi")]
        assert eng.handle_peer(CLIENT, peer, b"back", T0)
    refresh = client.request(stun.Method.REFRESH, {"REQUESTED-ADDRESS-FAMILY": IPV6})
    assert refresh.message_class == stun.Class.RESPONSE
    deleted = client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    assert deleted.message_class == stun.Class.RESPONSE
    assert eng.allocations == {}
    assert [e for e in client.effects if isinstance(e, fx.CloseRelay)] == [fx.CloseRelay(CLIENT)]


def test_refresh_of_a_single_family_allocation_with_the_other_family_gets_443() -> None:
    client = Client(engine(other="2001:db8::1"))
    client.allocate()
    reply = client.request(stun.Method.REFRESH, {"REQUESTED-ADDRESS-FAMILY": IPV6})
    assert reply.error_code == 443


def test_an_ipv4_mapped_peer_is_permitted_and_relayed_as_its_ipv4_address() -> None:
    eng = engine()
    client = Client(eng)
    client.allocate()
    assert client.permit(("::ffff:10.0.0.5", 7000)) is None
    assert set(eng.allocations[CLIENT].permissions) == {"10.0.0.5"}
    send = stun.Message(stun.Method.SEND, stun.Class.INDICATION)
    send.attributes.update({"XOR-PEER-ADDRESS": ("::ffff:10.0.0.5", 7000), "DATA": b"x"})
    assert eng.handle_client(bytes(send), CLIENT, T0) == [
        fx.SendToPeer(CLIENT, ("10.0.0.5", 7000), b"x")
    ]


def test_a_client_on_a_dual_stack_socket_sees_its_ipv4_address_in_xor_mapped_address() -> None:
    eng = engine()
    mapped = ("::ffff:198.51.100.9", 40000)
    binding = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
    (answer,) = eng.handle_client(bytes(binding), mapped, T0)
    assert isinstance(answer, fx.SendToClient)
    assert answer.client == mapped
    reply = stun.parse_message(answer.data)
    assert reply.attributes["XOR-MAPPED-ADDRESS"] == ("198.51.100.9", 40000)
    client = Client(eng, mapped)
    answer_bytes = client.allocate()
    assert stun.parse_message(answer_bytes).attributes["XOR-MAPPED-ADDRESS"] == (
        "198.51.100.9",
        40000,
    )


# ------------------------------------------------------------------ routes


def route_policy(endpoints: list[str]) -> PeerPolicy:
    cfg = parse_config(
        {
            "version": "v1",
            "auth": {"credentials": {"username": "u", "password": "p"}},
            "listeners": [{"name": "l", "protocol": "TURN-UDP", "routes": ["c"]}],
            "clusters": [{"name": "c", "type": "STATIC", "endpoints": endpoints}],
        }
    )
    own = ProtectedRanges.build(["192.0.2.1", "2001:db8::1"])
    return policies_for(cfg.listeners[0], cfg, None, own).peers


@pytest.mark.parametrize(
    ("endpoints", "peer", "admitted"),
    [
        (["fd00::/64"], ("fd00::5", 9), True),
        (["fd00::/64"], ("fd00:0:0:1::5", 9), False),
        (["::1/128"], ("::1", 9), True),
        (["::/0"], ("::1", 9), False),
        (["::/0"], ("2001:db8:ffff::9", 9), True),
        (["::/0"], ("2001:db8::1", 9), False),  # stunnerd's own IPv6 relay address
        (["::/0"], ("fe80::1", 9), False),
        (["fe80::/10"], ("fe80::1", 9), True),
        (["0.0.0.0/0"], ("2001:db8:ffff::9", 9), False),  # 0.0.0.0/0 is IPv4 only
        (["::/0"], ("10.0.0.5", 9), False),
        # IPv4-mapped peers are IPv4 peers: IPv4 routes and IPv4 protections apply
        (["10.0.0.0/8"], ("::ffff:10.0.0.5", 9), True),
        (["::/0"], ("::ffff:10.0.0.5", 9), False),
        (["0.0.0.0/0"], ("::ffff:127.0.0.1", 9), False),
        (["0.0.0.0/0", "::/0"], ("::ffff:169.254.169.254", 9), False),
        (["0.0.0.0/0"], ("::ffff:192.0.2.1", 9), False),
    ],
)
def test_ipv6_routes_admit_exactly_their_prefixes(
    endpoints: list[str], peer: tuple[str, int], admitted: bool
) -> None:
    client = Client(engine("2001:db8::1", other="192.0.2.1", peers=route_policy(endpoints)))
    client.allocate(
        requested_address_family=IPV6 if ":" in peer[0] and "." not in peer[0] else IPV4
    )
    assert (client.bind(peer) is None) is admitted
    assert (client.permit(peer) is None) is admitted


def test_an_ipv6_port_range_bounds_channels_like_an_ipv4_one() -> None:
    client = Client(engine("2001:db8::1", peers=route_policy(["fd00::/64:<9-10>"])))
    client.allocate()
    assert client.bind(("fd00::5", 11)) == 403
    assert client.bind(("fd00::5", 10)) is None
    assert client.permit(("fd00::5", 11)) is None  # a permission is for the IP (RFC 8656 §9)


def test_a_dual_tcp_allocation_gets_400() -> None:
    """RFC 6062 relays are single-family: ADDITIONAL-ADDRESS-FAMILY has no meaning there."""
    policies = Policies(StaticAuthenticator(REALM, "user1", "pass1"), AllowAllPeers(), UserQuota())
    eng = TurnEngine(
        relay_ip="192.0.2.1",
        other_relay_ip="2001:db8::1",
        nonce_secret=b"k" * 32,
        policies=policies,
        stream=True,
    )
    client = Client(eng)
    answer = client.raw(
        stun.Method.ALLOCATE,
        {"REQUESTED-TRANSPORT": 6 << 24, "ADDITIONAL-ADDRESS-FAMILY": IPV6},
    )
    assert error_of(answer) == 400
    assert client.opened == []
