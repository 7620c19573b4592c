"""IPv6 peers that carry an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible) and the one
family answer every method gives (RFC 8656 §10.2 and §12.2, RFC 6062 §5.2).

Under upstream's documented wildcard routes (`0.0.0.0/0` and `::/0`) such a peer is judged by the
IPv4 address it carries as well as by itself: `64:ff9b::7f00:1` reaches loopback through a NAT64
gateway, so it is refused as 127.0.0.1 is.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Callable
from ipaddress import IPv4Address, IPv6Address
from typing import Any

import pytest
from aioice import stun
from hypothesis import given
from hypothesis import strategies as st

from stunner_common.config import parse_config
from stunnerd.protected import STANDARD_RANGES, ProtectedRanges
from stunnerd.routing import DnsCache, RoutePeerPolicy, policies_for
from stunnerd.turn import effects as fx
from stunnerd.turn.embedded import EMBEDDINGS, embedding_of
from stunnerd.turn.engine import Policies, TurnEngine
from stunnerd.turn.policies import PeerPolicy, StaticAuthenticator, UserQuota
from stunnerd.turn.refusals import forbidden_detail
from support.stun import CONNECT, parse

pytestmark = pytest.mark.usefixtures("aioice_turn_attributes")

OWN = ("192.0.2.1", "2001:db8::1")
WILDCARD = ["0.0.0.0/0", "::/0"]
REALM = "stunner.l7mp.io"
T0 = 1_000_000.0
IPV4, IPV6 = 0x01, 0x02
UDP, TCP = 17 << 24, 6 << 24


def policy(
    endpoints: list[str],
    *,
    kind: str = "STATIC",
    dns: DnsCache | None = None,
    clusters: list[dict[str, Any]] | None = None,
) -> RoutePeerPolicy:
    cfg = parse_config(
        {
            "version": "v1",
            "auth": {"credentials": {"username": "u", "password": "p"}},
            "listeners": [
                {
                    "name": "l",
                    "protocol": "TURN-UDP",
                    "routes": [c["name"] for c in clusters] if clusters else ["c"],
                }
            ],
            "clusters": clusters or [{"name": "c", "type": kind, "endpoints": endpoints}],
        }
    )
    peers = policies_for(cfg.listeners[0], cfg, dns, ProtectedRanges.build(OWN)).peers
    assert isinstance(peers, RoutePeerPolicy)
    return peers


# ------------------------------------------------------------------ building embedded addresses


def compat(v4: IPv4Address) -> IPv6Address:
    return IPv6Address(int(v4))


def nat64(v4: IPv4Address) -> IPv6Address:
    return IPv6Address(int(IPv6Address("64:ff9b::")) | int(v4))


def local_use(v4: IPv4Address) -> IPv6Address:
    """RFC 6052 §2.2 with a /48 prefix: 16 bits, the u octet (zero), 16 bits."""
    value = int(v4)
    return IPv6Address(
        int(IPv6Address("64:ff9b:1::")) | (value >> 16) << 64 | (value & 0xFFFF) << 40
    )


def six_to_four(v4: IPv4Address) -> IPv6Address:
    return IPv6Address(0x2002 << 112 | int(v4) << 80)


def teredo(server: IPv4Address, client: IPv4Address) -> IPv6Address:
    flags, port, obscured = 0x8000, 0x63BF, ~int(client) & 0xFFFFFFFF
    return IPv6Address(0x20010000 << 96 | int(server) << 64 | flags << 48 | port << 32 | obscured)


PUBLIC = IPv4Address("198.51.100.9")
LOOPBACK = IPv4Address("127.0.0.1")
IPV4S = st.integers(0, 2**32 - 1).map(IPv4Address)


# ------------------------------------------------------------------ where the IPv4 address sits


@pytest.mark.parametrize(
    ("ip", "name", "carried"),
    [
        ("::127.0.0.1", "IPv4-compatible", ["127.0.0.1"]),
        ("::c000:221", "IPv4-compatible", ["192.0.2.33"]),
        ("64:ff9b::7f00:1", "NAT64", ["127.0.0.1"]),
        ("64:ff9b::192.0.2.33", "NAT64", ["192.0.2.33"]),
        # RFC 6052 §2.4's /48 example, moved into RFC 8215's local-use prefix
        ("64:ff9b:1:c000:2:2100::", "local-use NAT64", ["192.0.2.33"]),
        ("2002:7f00:1::", "6to4", ["127.0.0.1"]),
        ("2002:c000:221:1::5", "6to4", ["192.0.2.33"]),
        # Teredo (RFC 4380 §4): server 65.54.227.120, client 192.0.2.45 (stored inverted)
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo", ["65.54.227.120", "192.0.2.45"]),
    ],
)
def test_each_embedding_yields_the_ipv4_addresses_it_carries(
    ip: str, name: str, carried: list[str]
) -> None:
    found = embedding_of(ip)
    assert found is not None
    assert found[0].name.startswith(name)
    assert [str(a) for a in found[1]] == carried


@pytest.mark.parametrize(
    "ip",
    ["127.0.0.1", "::", "::1", "::ffff:127.0.0.1", "2001:db8::1", "fd00::1", "64:ff9b:2::1", "x"],
)
def test_other_addresses_carry_nothing(ip: str) -> None:
    assert embedding_of(ip) is None


@given(IPV4S, IPV4S)
def test_the_places_agree_with_the_standard_library_and_rfc_6052(
    v4: IPv4Address, other: IPv4Address
) -> None:
    assert six_to_four(v4).sixtofour == v4
    assert teredo(other, v4).teredo == (other, v4)
    assert embedding_of(str(six_to_four(v4))) is not None
    assert embedding_of(str(six_to_four(v4)))[1] == (v4,)  # type: ignore[index]
    assert embedding_of(str(teredo(other, v4)))[1] == (other, v4)  # type: ignore[index]
    assert embedding_of(str(nat64(v4)))[1] == (v4,)  # type: ignore[index]
    assert embedding_of(str(local_use(v4)))[1] == (v4,)  # type: ignore[index]
    if int(v4) > 1:  # :: and ::1 are IPv6 addresses in their own right
        assert embedding_of(str(compat(v4)))[1] == (v4,)  # type: ignore[index]


def test_the_embeddings_do_not_overlap() -> None:
    nets = [e.prefix for e in EMBEDDINGS]
    assert not [(a, b) for a in nets for b in nets if a != b and a.overlaps(b)]


# ------------------------------------------------------------------ the rule


T_LOOP = str(teredo(IPv4Address("65.54.227.120"), LOOPBACK))
T_SERVER_LOOP = str(teredo(LOOPBACK, PUBLIC))
T_PUBLIC = str(teredo(IPv4Address("65.54.227.120"), PUBLIC))


@pytest.mark.parametrize(
    ("endpoints", "peer", "admitted"),
    [
        # the wildcard: a peer carrying a protected address is refused as that address is
        (WILDCARD, "::127.0.0.1", False),
        (WILDCARD, "64:ff9b::7f00:1", False),
        (WILDCARD, "64:ff9b::7f01:203", False),
        (WILDCARD, "64:ff9b::a9fe:a9fe", False),  # the metadata service
        (WILDCARD, "64:ff9b::a9fe:101", False),  # link-local
        (WILDCARD, "64:ff9b::c000:201", False),  # stunnerd's own address, 192.0.2.1
        (WILDCARD, "2002:7f00:1::", False),
        (WILDCARD, "2002:a9fe:a9fe::1", False),
        (WILDCARD, T_LOOP, False),
        (WILDCARD, T_SERVER_LOOP, False),
        (WILDCARD, str(local_use(LOOPBACK)), False),
        # ... one carrying an ordinary address passes where the IPv4 routes admit that address
        (WILDCARD, "::c633:6409", True),
        (WILDCARD, "64:ff9b::c633:6409", True),
        (WILDCARD, "2002:c633:6409::", True),
        (WILDCARD, T_PUBLIC, True),
        # ... except the local-use range, whose layout only its operator knows
        (WILDCARD, str(local_use(PUBLIC)), False),
        # IPv6 routes alone admit no IPv4 address, carried or not
        (["::/0"], "64:ff9b::c633:6409", False),
        (["::/0"], "2002:c633:6409::", False),
        (["::/0"], T_PUBLIC, False),
        (["::/0"], "2001:db8:ffff::9", True),  # an ordinary IPv6 peer
        # narrow IPv4 routes
        (["198.51.100.0/24", "::/0"], "64:ff9b::c633:6409", True),
        (["198.51.100.0/24", "::/0"], "64:ff9b::cb00:7109", False),  # 203.0.113.9
        (["198.51.100.0/24", "::/0"], T_PUBLIC, False),  # its server is not admitted
        (["198.51.100.0/24", "65.54.227.120", "::/0"], T_PUBLIC, True),
        # the IPv4 peer named explicitly: its embedded form too, where IPv6 is admitted
        (["127.0.0.1/32", "::/0"], "64:ff9b::7f00:1", True),
        (["127.0.0.1/32"], "64:ff9b::7f00:1", False),
        # a route naming the IPv6 range admits what it carries, without an IPv4 route ...
        (["64:ff9b::/96"], "64:ff9b::c633:6409", True),
        (["64:ff9b::c633:6400/120"], "64:ff9b::c633:6409", True),
        (["2002::/16"], "2002:c633:6409::", True),
        (["2001::/32"], T_PUBLIC, True),
        (["::/96"], "::c633:6409", True),
        (["64:ff9b:1::/48"], str(local_use(PUBLIC)), True),
        (["64:ff9b::/96"], "2002:c633:6409::", False),  # another range
        (["64:ff9b::/95"], "64:ff9b::c633:6409", False),  # wider than the range: not naming it
        # ... but a protected one only from inside that range's image
        (["64:ff9b::/96"], "64:ff9b::7f00:1", False),
        (["64:ff9b::/96", "0.0.0.0/0"], "64:ff9b::7f00:1", False),
        (["64:ff9b::7f00:1/128"], "64:ff9b::7f00:1", True),
        (["64:ff9b::7f00:0/104"], "64:ff9b::7f01:203", True),
        (["64:ff9b::7e00:0/103"], "64:ff9b::7f00:1", False),  # 126.0.0.0/7: not inside
        (["64:ff9b::a9fe:0/112"], "64:ff9b::a9fe:a9fe", False),  # link-local, not metadata
        (["64:ff9b::a9fe:a9fe/128"], "64:ff9b::a9fe:a9fe", True),
        (["2002:7f00::/24"], "2002:7f00:1::", True),
        (["2002::/16"], "2002:7f00:1::", False),
        (["::127.0.0.1/128"], "::127.0.0.1", True),
        (["::/96"], "::127.0.0.1", False),
        (["64:ff9b:1::/48"], str(local_use(LOOPBACK)), False),
        (["2001::/32"], T_LOOP, False),
        # :: and ::1 stay IPv6's own protected addresses
        (WILDCARD, "::1", False),
        (WILDCARD, "::", False),
        (["::1"], "::1", True),
        # IPv4-mapped peers are IPv4 peers
        (WILDCARD, "::ffff:127.0.0.1", False),
        (WILDCARD, "::ffff:198.51.100.9", True),
    ],
)
def test_an_embedded_peer_needs_its_ipv4_address_admitted_or_its_range_named(
    endpoints: list[str], peer: str, admitted: bool
) -> None:
    peers = policy(endpoints)
    assert peers.admits_ip(peer) is admitted
    assert peers.admits(peer, 5000) is admitted
    assert (peers.cluster_of(peer, 5000) == "c") is admitted


def test_port_ranges_bound_the_carried_address_like_the_peer_itself() -> None:
    peers = policy(["0.0.0.0/0:<5000-5000>", "::/0"])
    assert peers.admits("64:ff9b::c633:6409", 5000)
    assert not peers.admits("64:ff9b::c633:6409", 5001)
    assert peers.admits_ip("64:ff9b::c633:6409")  # a permission names no port


def test_data_needs_a_udp_route_for_the_carried_address_as_well() -> None:
    peers = policy(
        [],
        clusters=[
            {"name": "v6", "type": "STATIC", "protocol": "UDP", "endpoints": ["::/0"]},
            {"name": "v4", "type": "STATIC", "protocol": "TCP", "endpoints": ["0.0.0.0/0"]},
        ],
    )
    assert peers.admits_ip("64:ff9b::c633:6409")  # permissions: any routed cluster
    assert not peers.admits("64:ff9b::c633:6409", 5000)  # data: UDP clusters only


def test_a_dns_name_resolving_to_an_embedded_address_names_it() -> None:
    dns = DnsCache()
    dns.update("media.example.com", {"64:ff9b::c633:6409"})  # a DNS64 answer
    dns.update("evil.example.com", {"64:ff9b::7f00:1"})
    dns.update("localhost", {"::127.0.0.1"})
    peers = policy(
        ["media.example.com", "evil.example.com", "localhost"], kind="STRICT_DNS", dns=dns
    )
    assert peers.admits("64:ff9b::c633:6409", 9)
    assert not peers.admits("64:ff9b::7f00:1", 9)
    assert peers.admits("::127.0.0.1", 9)  # a localhost name, loopback: as for IPv4


PROTECTED_V4 = [ipaddress.IPv4Network(net) for net, _ in STANDARD_RANGES if ":" not in net] + [
    ipaddress.IPv4Network(f"{OWN[0]}/32")
]


PROTECTED_IPV4 = st.sampled_from(PROTECTED_V4).flatmap(
    lambda net: st.integers(int(net.network_address), int(net.broadcast_address)).map(IPv4Address)
)


def ordinary(v4: IPv4Address) -> bool:
    return not any(v4 in net for net in PROTECTED_V4)


FORMS: dict[str, Callable[[IPv4Address], IPv6Address]] = {
    "compat": compat,
    "nat64": nat64,
    "local-use": local_use,
    "6to4": six_to_four,
    "teredo-client": lambda v4: teredo(PUBLIC, v4),
    "teredo-server": lambda v4: teredo(v4, PUBLIC),
}
WILDCARD_POLICY = policy(WILDCARD)
IPV6_ONLY_POLICY = policy(["::/0"])


@given(PROTECTED_IPV4, st.sampled_from(sorted(FORMS)), st.integers(1, 65535))
def test_the_wildcard_admits_no_embedded_form_of_a_protected_address(
    v4: IPv4Address, form: str, port: int
) -> None:
    ip = str(FORMS[form](v4))
    if ip in ("::", "::1"):
        return
    assert not WILDCARD_POLICY.admits_ip(ip)
    assert not WILDCARD_POLICY.admits(ip, port)


@given(IPV4S.filter(ordinary), st.sampled_from(sorted(FORMS)))
def test_an_embedded_ordinary_address_follows_the_ipv4_routes(v4: IPv4Address, form: str) -> None:
    ip = str(FORMS[form](v4))
    assert WILDCARD_POLICY.admits_ip(ip) is (form != "local-use")
    assert not IPV6_ONLY_POLICY.admits_ip(ip)


# ------------------------------------------------------------------ the log


def test_the_refusal_note_names_the_carried_address_and_its_range() -> None:
    detail = forbidden_detail(policy(WILDCARD), (("64:ff9b::7f00:1", 80),))
    assert "peer [64:ff9b::7f00:1]:80 is admitted by no route" in detail
    assert "carries 127.0.0.1 (NAT64, RFC 6052), in protected range 127.0.0.0/8" in detail
    detail = forbidden_detail(policy(["::/0"]), (("2002:c633:6409::", 80),))
    assert "carries 198.51.100.9 (6to4, RFC 3056): a route must admit that address" in detail
    assert "name 2002::/16 or a prefix inside it" in detail


# ------------------------------------------------------------------ one answer in every method


class Scripted:
    """A client of the sans-IO engine: aioice builds its requests, the test opens its relay."""

    def __init__(self, engine: TurnEngine, addr: tuple[str, int]) -> None:
        self.engine = engine
        self.addr = addr
        self.nonce: bytes | None = None
        self.key = hashlib.md5(f"user1:{REALM}:pass1".encode()).digest()
        self.effects: list[fx.Effect] = []

    def request(self, method: int, attrs: dict[str, Any]) -> int | None:
        """The error code of the answer (None: success, or no answer yet)."""
        for _ in range(2):
            msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))  # type: ignore[arg-type]
            if self.nonce is not None:
                msg.attributes.update({"USERNAME": "user1", "REALM": REALM, "NONCE": self.nonce})
                msg.add_message_integrity(self.key)
            effects = self.engine.handle_client(bytes(msg), self.addr, T0)
            for effect in effects:
                if isinstance(effect, fx.OpenRelay):
                    effects += self.engine.relay_opened(self.addr, 50000, T0)
            self.effects = effects
            answers = [parse(e.data) for e in effects if isinstance(e, fx.SendToClient)]
            if not answers:
                return None
            if answers[0].error_code == 401 and self.nonce is None:
                self.nonce = answers[0].attributes["NONCE"]
                continue
            return answers[0].error_code
        raise AssertionError("challenged twice")

    def send(self, peer: tuple[str, int]) -> list[fx.Effect]:
        msg = stun.Message(stun.Method.SEND, stun.Class.INDICATION)
        msg.attributes.update({"XOR-PEER-ADDRESS": peer, "DATA": b"x"})
        return self.engine.handle_client(bytes(msg), self.addr, T0)


def engine(peers: PeerPolicy, *, stream: bool = False) -> TurnEngine:
    return TurnEngine(
        relay_ip="192.0.2.1",
        other_relay_ip="2001:db8::1",
        nonce_secret=b"k" * 32,
        policies=Policies(StaticAuthenticator(REALM, "user1", "pass1"), peers, UserQuota()),
        stream=stream,
    )


def allocated(family: int, transport: int, peers: PeerPolicy) -> Scripted:
    client = Scripted(engine(peers, stream=transport == TCP), ("203.0.113.7", 40000))
    attrs = {"REQUESTED-TRANSPORT": transport, "REQUESTED-ADDRESS-FAMILY": family}
    assert client.request(stun.Method.ALLOCATE, attrs) is None
    assert client.engine.allocations
    return client


# (peer, answer on an IPv4 allocation, answer on an IPv6 one) under the wildcard routes
ANSWERS = [
    ("198.51.100.9", None, 443),
    ("::ffff:198.51.100.9", None, 443),
    ("127.0.0.1", 403, 443),
    ("::ffff:127.0.0.1", 403, 443),
    ("::ffff:169.254.169.254", 403, 443),
    ("::127.0.0.1", 443, 403),
    ("64:ff9b::7f00:1", 443, 403),
    ("64:ff9b::a9fe:a9fe", 443, 403),
    ("64:ff9b::c000:201", 443, 403),
    (str(local_use(LOOPBACK)), 443, 403),
    (str(local_use(PUBLIC)), 443, 403),
    ("2002:7f00:1::", 443, 403),
    (T_LOOP, 443, 403),
    ("::1", 443, 403),
    ("64:ff9b::c633:6409", 443, None),
    ("2002:c633:6409::", 443, None),
    (T_PUBLIC, 443, None),
    ("2001:db8:ffff::9", 443, None),
]


@pytest.mark.parametrize(("peer", "on_ipv4", "on_ipv6"), ANSWERS)
@pytest.mark.parametrize("family", [IPV4, IPV6], ids=["ipv4-allocation", "ipv6-allocation"])
def test_every_method_gives_the_same_answer_for_a_peer(
    peer: str, on_ipv4: int | None, on_ipv6: int | None, family: int
) -> None:
    expected = on_ipv4 if family == IPV4 else on_ipv6
    address = (peer, 9000)
    udp = allocated(family, UDP, policy(WILDCARD))
    bind = {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": address}
    assert udp.request(stun.Method.CHANNEL_BIND, bind) == expected
    routed = [e for e in udp.effects if isinstance(e, fx.ChannelRouteAdded)]
    # the C relay and the kernel offload relay only the routes the engine announces
    assert bool(routed) is (expected is None)
    assert udp.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": address}) == expected
    sent = [e for e in udp.send(address) if isinstance(e, fx.SendToPeer)]
    assert bool(sent) is (expected is None)
    tcp = allocated(family, TCP, policy(WILDCARD))
    assert tcp.request(CONNECT, {"XOR-PEER-ADDRESS": address}) == expected
    asked = [e.peer for e in tcp.effects if isinstance(e, fx.ConnectPeer)]
    unmapped = ipaddress.ip_address(peer)
    if isinstance(unmapped, IPv6Address) and unmapped.ipv4_mapped is not None:
        unmapped = unmapped.ipv4_mapped
    assert asked == ([(str(unmapped), 9000)] if expected is None else [])


def test_a_send_indication_judges_its_peer_again_after_the_routes_change() -> None:
    """A permission made under a route naming the peer stops relaying under the wildcard."""
    client = allocated(IPV6, UDP, policy(["64:ff9b::7f00:1/128"]))
    peer = ("64:ff9b::7f00:1", 9000)
    bind = {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer}
    assert client.request(stun.Method.CHANNEL_BIND, bind) is None
    assert [e for e in client.send(peer) if isinstance(e, fx.SendToPeer)]
    current = client.engine.policies
    changed = client.engine.set_policies(
        Policies(current.authenticator, policy(WILDCARD), current.quota), T0
    )
    assert [e for e in changed if isinstance(e, fx.ChannelRouteRemoved)]
    assert not [e for e in client.send(peer) if isinstance(e, fx.SendToPeer)]
    assert not client.engine.handle_peer(client.addr, peer, b"back", T0)
