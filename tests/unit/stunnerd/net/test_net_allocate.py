"""The edge's half of Allocate on a TURN-UDP listener: the cluster-wide quota's leases, EVEN-PORT
reservations (RFC 8656 §14.6) and the cluster counters a channel's traffic lands in."""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

import pytest
from aioice import stun

from stunnerd.turn.engine import Policies
from support import fake_listeners as kit
from support.fake_listeners import CLIENT, RelayPorts, client_at, feed, udp_listener
from support.fake_net import MockLoop


class FakeQuota:
    """A `stunnerd.net.ports.QuotaLeases`, answering from a set of admitted users."""

    def __init__(self, admitted: set[str]) -> None:
        self.admitted = admitted
        self.limit = 1
        self.enforcing = True
        self.held: dict[str, float] = {}  # lease → lifetime
        self.released: list[str] = []

    def lease_id(self, listener: str, client: tuple[str, int]) -> str:
        return f"{listener}|{client[0]}:{client[1]}"

    async def acquire(self, user_id: str, lease: str, lifetime_s: float) -> bool:
        if user_id not in self.admitted:
            return False
        self.held[lease] = lifetime_s
        return True

    def renew(self, lease: str, lifetime_s: float) -> None:
        self.held[lease] = lifetime_s

    def release(self, lease: str) -> None:
        self.held.pop(lease)
        self.released.append(lease)


@dataclasses.dataclass(frozen=True)
class OneCluster:
    """Admits every peer and files it under one cluster name."""

    name: str

    def admits_ip(self, ip: str) -> bool:
        return True

    def admits(self, ip: str, port: int) -> bool:
        return True

    def cluster_of(self, ip: str, port: int) -> str | None:
        return self.name


def clustered(name: str) -> Policies:
    base = kit.policies()
    return Policies(base.authenticator, OneCluster(name), base.quota)


async def test_a_lease_is_taken_before_the_relay_renewed_and_released_with_it(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    quota = FakeQuota({kit.USER})
    listener.quota = quota
    client = client_at(listener, loop)
    client.allocate(lifetime_s=600)
    lease = f"{listener.name}|{CLIENT[0]}:{CLIENT[1]}"
    assert quota.held == {lease: 600}
    client.request(stun.Method.REFRESH, {"LIFETIME": 1200})
    assert quota.held == {lease: 1200}
    client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    assert quota.held == {}
    assert quota.released == [lease]


async def test_a_user_over_the_cluster_wide_quota_is_answered_486_and_binds_nothing(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    listener.quota = FakeQuota(set())
    client = client_at(listener, loop)
    reply = client.request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24})
    assert reply.error_code == 486
    assert ports.opened == []
    assert listener.allocation_count == 0


@pytest.mark.usefixtures("aioice_turn_attributes")
async def test_even_port_with_r_holds_the_next_port_for_the_token_holder(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    rtp = client_at(listener, loop, ("192.0.2.10", 1))
    reply = rtp.request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "EVEN-PORT": 0x80})
    port = reply.attributes["XOR-RELAYED-ADDRESS"][1]
    assert port % 2 == 0
    assert sorted(listener.held_ports) == [port + 1]
    held = listener.held_ports[port + 1]

    rtcp = client_at(listener, loop, ("192.0.2.10", 2))
    rtcp.nonce, rtcp.realm = rtp.nonce, rtp.realm
    token = reply.attributes["RESERVATION-TOKEN"]
    reply = rtcp.request(
        stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "RESERVATION-TOKEN": token}
    )
    assert reply.attributes["XOR-RELAYED-ADDRESS"][1] == port + 1
    assert listener.held_ports == {}
    assert listener.relays[("192.0.2.10", 2)].sock is held  # the very socket held for it
    assert len(ports.opened) == 2


@pytest.mark.usefixtures("aioice_turn_attributes")
async def test_an_unclaimed_reservation_is_closed_when_it_expires(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    rtp = client_at(listener, loop)
    rtp.request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "EVEN-PORT": 0x80})
    [held] = listener.held_ports.values()
    loop.advance(60)
    assert listener.held_ports == {}
    assert held.closed  # type: ignore[attr-defined]


async def test_channel_traffic_counts_under_the_peers_cluster_even_after_a_policy_change(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports)
    listener.set_policies(clustered("media"))
    client = client_at(listener, loop)
    client.allocate()
    client.channel_bind()
    [(_t, relay)] = loop.endpoints[1:]
    feed(listener, kit.channel_data(b"12345", pad=False))
    relay.datagram_received(b"abc", kit.PEER)
    assert listener.cluster_traffic["media"] == [1, 3, 1, 5]

    listener.set_policies(clustered("other"))
    feed(listener, kit.channel_data(b"1234567", pad=False))
    relay.datagram_received(b"abcd", kit.PEER)
    assert listener.cluster_traffic["media"] == [1, 3, 1, 5]
    assert listener.cluster_traffic["other"] == [1, 4, 1, 7]


PEER6 = ("2001:db8:1::7", 5000)
IPV6 = 0x02


def send_indication(peer: tuple[str, int], data: bytes) -> bytes:
    attrs = {"XOR-PEER-ADDRESS": peer, "DATA": data}
    return bytes(stun.Message(stun.Method.SEND, stun.Class.INDICATION, attributes=attrs))


@pytest.mark.usefixtures("aioice_turn_attributes")
async def test_a_dual_allocation_relays_each_peer_from_the_socket_of_its_family(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports, other_relay_ip="2001:db8::1")
    client = client_at(listener, loop)
    reply = client.request(
        stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "ADDITIONAL-ADDRESS-FAMILY": IPV6}
    )
    assert reply.message_class == stun.Class.RESPONSE
    v4, v6 = ports.opened
    assert v6.family == socket.AF_INET6
    for peer in (kit.PEER, PEER6):
        client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": peer})
        feed(listener, send_indication(peer, b"to " + peer[0].encode()))
    assert v4.sent == [(b"to " + kit.PEER[0].encode(), kit.PEER)]
    assert v6.sent == [(b"to " + PEER6[0].encode(), PEER6)]
    client.request(stun.Method.REFRESH, {"LIFETIME": 0})
    assert v4.closed
    assert v6.closed
    assert listener.dual_relays == {}


@pytest.mark.usefixtures("aioice_turn_attributes")
async def test_a_dual_allocation_whose_second_socket_fails_closes_the_first_and_fails(
    loop: MockLoop, ports: RelayPorts
) -> None:
    listener, _sock = await udp_listener(loop, ports, other_relay_ip="2001:db8::1")

    def ipv4_only(bind_host: str, family: int, even: bool, port: int = 0) -> Any:
        if family == 6:
            raise OSError(99, "Cannot assign requested address")
        return ports.bind(bind_host, family, even, port)

    listener.opener.bind_socket = ipv4_only
    reply = client_at(listener, loop).request(
        stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "ADDITIONAL-ADDRESS-FAMILY": IPV6}
    )
    assert reply.error_code == 508
    [v4] = ports.opened
    assert v4.closed
    assert listener.relays == {}
