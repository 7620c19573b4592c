"""The C relay of established channels (`stunnerd._fastpath`) on real loopback sockets.

Datagrams sent on loopback are in the receiver's queue when `sendto` returns, so each `poll()`
below sees exactly what was sent before it.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pytest

from stunnerd import fastpath

pytestmark = pytest.mark.integration

if not fastpath.available():
    if os.environ.get("CI"):
        raise AssertionError("stunnerd._fastpath was not built (gcc and Python headers needed)")
    pytest.skip("stunnerd._fastpath is not built", allow_module_level=True)

from stunnerd import _fastpath  # noqa: E402

LISTENER_SLOT, CLUSTER_SLOT = 0, 1


def udp(host: str = "127.0.0.1") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.setblocking(False)
    return sock


def addr(sock: socket.socket) -> tuple[str, int]:
    name = sock.getsockname()
    return (name[0], name[1])


class Rig:
    """A listener and a relay socket in the C relay, with a client and a peer around them."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.relay = _fastpath.FastRelay()
        self.listener, self.relay_sock = udp(host), udp(host)
        self.client, self.peer = udp(host), udp(host)
        self.relay.watch(self.listener.fileno(), _fastpath.LISTENER, LISTENER_SLOT)
        self.relay.watch(self.relay_sock.fileno(), _fastpath.RELAY, LISTENER_SLOT)

    def route(self, channel: int = 0x4000) -> None:
        lfd, rfd = self.listener.fileno(), self.relay_sock.fileno()
        c, p = addr(self.client), addr(self.peer)
        self.relay.add_client_route(lfd, c[0], c[1], channel, rfd, p[0], p[1], CLUSTER_SLOT)
        self.relay.add_peer_route(rfd, p[0], p[1], channel, lfd, c[0], c[1], CLUSTER_SLOT)

    def counters(self) -> dict[int, tuple[int, int, int, int]]:
        return {slot: tuple(rest) for slot, *rest in self.relay.take_counters()}  # type: ignore[misc]

    def close(self) -> None:
        self.relay.close()
        for s in (self.listener, self.relay_sock, self.client, self.peer):
            s.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.close()


def recv(sock: socket.socket) -> tuple[bytes, tuple[str, int]]:
    data, source = sock.recvfrom(70000)
    return data, (source[0], source[1])


def channel_data(channel: int, payload: bytes) -> bytes:
    return struct.pack("!HH", channel, len(payload)) + payload


def test_routed_channel_data_reaches_the_peer_from_the_relay_socket_and_is_counted(
    rig: Rig,
) -> None:
    rig.route()
    rig.client.sendto(channel_data(0x4000, b"x" * 160), addr(rig.listener))
    assert rig.relay.poll() == []
    assert recv(rig.peer) == (b"x" * 160, addr(rig.relay_sock))
    assert rig.counters() == {LISTENER_SLOT: (1, 164, 0, 0), CLUSTER_SLOT: (0, 0, 1, 160)}
    assert rig.counters() == {}, "take_counters zeroes what it hands over"


def test_a_peer_datagram_goes_back_to_the_client_as_channel_data_from_the_listener(
    rig: Rig,
) -> None:
    rig.route(0x4001)
    for i in range(100):  # more than one recvmmsg batch on one relay socket
        rig.peer.sendto(b"%03d" % i, addr(rig.relay_sock))
    assert rig.relay.poll() == []
    got = [recv(rig.client) for _ in range(100)]
    assert got == [(channel_data(0x4001, b"%03d" % i), addr(rig.listener)) for i in range(100)]
    assert rig.counters() == {LISTENER_SLOT: (0, 0, 100, 700), CLUSTER_SLOT: (100, 300, 0, 0)}


def test_everything_without_a_route_goes_to_python_with_its_socket_and_sender(rig: Rig) -> None:
    rig.route(0x4000)
    stun = bytes(20)
    rig.client.sendto(stun, addr(rig.listener))  # not ChannelData
    rig.client.sendto(channel_data(0x4002, b"a"), addr(rig.listener))  # unbound channel
    rig.client.sendto(struct.pack("!HH", 0x4000, 50) + b"short", addr(rig.listener))  # bad length
    with udp() as stranger:
        stranger.sendto(b"hi", addr(rig.relay_sock))  # a peer without a channel
        stranger.sendto(channel_data(0x4000, b"b"), addr(rig.listener))  # someone else's channel
        misses = rig.relay.poll()
        s = addr(stranger)
    lfd, rfd, c = rig.listener.fileno(), rig.relay_sock.fileno(), addr(rig.client)
    assert sorted(misses) == sorted(
        [
            (lfd, stun, c),
            (lfd, channel_data(0x4002, b"a"), c),
            (lfd, struct.pack("!HH", 0x4000, 50) + b"short", c),
            (rfd, b"hi", s),
            (lfd, channel_data(0x4000, b"b"), s),
        ]
    )
    assert rig.relay.stats()["relayed"] == 0


def test_removed_routes_and_unwatched_sockets_are_forgotten(rig: Rig) -> None:
    rig.route(0x4000)
    c = addr(rig.client)
    rig.relay.remove_client_route(rig.listener.fileno(), c[0], c[1], 0x4000)
    rig.client.sendto(channel_data(0x4000, b"a"), addr(rig.listener))
    rig.peer.sendto(b"b", addr(rig.relay_sock))
    misses = rig.relay.poll()
    assert [m[0] for m in misses] == [rig.listener.fileno()]  # the peer side is still routed
    assert recv(rig.client)[0] == channel_data(0x4000, b"b")
    rig.relay.unwatch(rig.relay_sock.fileno())
    assert rig.relay.stats()["peer_routes"] == 0
    rig.peer.sendto(b"c", addr(rig.relay_sock))
    assert rig.relay.poll() == []  # not watched any more: Python reads it (or nobody)
    assert recv(rig.relay_sock)[0] == b"c"


def test_thousands_of_routes_grow_the_tables_and_deletes_keep_them_consistent() -> None:
    relay = _fastpath.FastRelay()
    try:
        for port in range(1, 3001):
            relay.add_client_route(5, "127.0.0.1", port, 0x4000, 6, "127.0.0.2", port, 1)
            relay.add_peer_route(6, "127.0.0.2", port, 0x4000, 5, "127.0.0.1", port, 1)
        for port in range(1, 3001, 2):
            relay.remove_client_route(5, "127.0.0.1", port, 0x4000)
            relay.remove_peer_route(6, "127.0.0.2", port, 0)
        assert relay.stats()["client_routes"] == 1500
        assert relay.stats()["peer_routes"] == 1500
        for port in range(1, 3001):  # re-adding over tombstones
            relay.add_client_route(5, "127.0.0.1", port, 0x4000, 6, "127.0.0.2", port, 1)
        assert relay.stats()["client_routes"] == 3000
        with pytest.raises(ValueError, match="not an IP address"):
            relay.add_client_route(5, "nowhere", 1, 0x4000, 6, "127.0.0.2", 1, 1)
    finally:
        relay.close()


def test_ipv6_routes_relay_both_ways() -> None:
    try:
        r = Rig("::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    try:
        r.route()
        r.client.sendto(channel_data(0x4000, b"six"), addr(r.listener))
        r.peer.sendto(b"back", addr(r.relay_sock))
        assert r.relay.poll() == []
        assert recv(r.peer)[0] == b"six"
        assert recv(r.client)[0] == channel_data(0x4000, b"back")
        r.client.sendto(b"\x00\x01" + bytes(18), addr(r.listener))
        ((fd, _data, source),) = r.relay.poll()
        assert fd == r.listener.fileno()
        assert source[:2] == addr(r.client)
        assert len(source) == 4
    finally:
        r.close()


def stun_header(method: int, length: int) -> bytes:
    return struct.pack("!HHI", method, length, 0x2112A442) + bytes(12)


def test_with_a_stun_limit_junk_is_dropped_in_c_and_only_what_the_engine_reads_reaches_python(
    rig: Rig,
) -> None:
    rig.relay.watch(rig.listener.fileno(), _fastpath.LISTENER, LISTENER_SLOT, 1500)
    binding = stun_header(0x0001, 8) + bytes(8)
    unrouted = channel_data(0x4002, b"a")
    junk = [
        bytes([0x17]) + os.urandom(1399),  # random bytes that could start a STUN header
        bytes([0x80]) + bytes(19),  # top bits set: neither STUN nor ChannelData
        stun_header(0x0003, 60_000 - 20) + bytes(60_000 - 20),  # over the 1500-byte limit
        stun_header(0x0003, 16) + bytes(8),  # length does not match the datagram
        stun_header(0x0003, 6)[:4] + b"\x00\x00\x00\x00" + bytes(12) + bytes(8),  # no cookie
        bytes(20)[:2] + b"\x00\x02" + bytes(16),  # length not a multiple of 4
        b"\x00\x01",  # shorter than a header
    ]
    for datagram in [*junk, binding, unrouted]:
        rig.client.sendto(datagram, addr(rig.listener))
    misses = rig.relay.poll()
    lfd, c = rig.listener.fileno(), addr(rig.client)
    assert misses == [(lfd, binding, c), (lfd, unrouted, c)]
    stats = rig.relay.stats()
    assert (stats["dropped"], stats["missed"]) == (len(junk), 2)
    sizes = sum(len(d) for d in [*junk, binding, unrouted])
    assert rig.counters() == {LISTENER_SLOT: (len(junk) + 2, sizes, 0, 0)}  # all received


def test_without_a_stun_limit_everything_unrouted_reaches_python(rig: Rig) -> None:
    junk = bytes([0x80]) + bytes(19)
    rig.client.sendto(junk, addr(rig.listener))
    assert rig.relay.poll() == [(rig.listener.fileno(), junk, addr(rig.client))]
    assert rig.relay.stats()["dropped"] == 0


def test_with_a_datagram_limit_longer_datagrams_are_read_in_part_and_dropped(rig: Rig) -> None:
    rig.relay.watch(rig.listener.fileno(), _fastpath.LISTENER, LISTENER_SLOT, 1500, 2048)
    rig.route(0x4000)
    fits = channel_data(0x4000, b"f" * (2048 - 4))
    too_long = channel_data(0x4000, b"t" * 2048)
    rig.client.sendto(too_long, addr(rig.listener))
    rig.client.sendto(fits, addr(rig.listener))
    assert rig.relay.poll() == []
    assert recv(rig.peer)[0] == b"f" * (2048 - 4)  # only the one that fits was relayed
    stats = rig.relay.stats()
    assert (stats["relayed"], stats["dropped"]) == (1, 1)
    with pytest.raises(ValueError, match="size limit"):
        rig.relay.watch(rig.listener.fileno(), _fastpath.LISTENER, LISTENER_SLOT, 1500, 70_000)
