"""The TC program run on single packets in the kernel (BPF_PROG_TEST_RUN), nothing sent: what it
makes of a client's ChannelData and of a peer's datagram, byte for byte, every checksum verified
here, for each way it sends (the kernel's neighbour lookup, the resolved MACs, a veth's far
end), and what it leaves alone."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from stunnerd.offload.datapath import PROG_TC, default_object_path
from stunnerd.offload.libbpf import BpfMap, BpfObject, run_program
from stunnerd.offload.maps import FWD_PEER_DEV, client_key, fwd, peer_key

pytestmark = pytest.mark.integration

TC_ACT_OK, TC_ACT_REDIRECT = 0, 7
CHANNEL = 0x4001
CLIENT, LISTENER = ("10.9.0.2", 40000), ("10.9.0.1", 3478)
RELAY, PEER = ("10.9.1.1", 49170), ("10.9.1.2", 50000)
WIRE_MACS = (b"\x02\xaa\x00\x00\x00\x01", b"\x02\xaa\x00\x00\x00\x02")
OUT_MACS = (b"\x02\xbb\x00\x00\x00\x01", b"\x02\xbb\x00\x00\x00\x02")


def _fold(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def frame(src: tuple[str, int], dst: tuple[str, int], payload: bytes, ttl: int = 17) -> bytes:
    """Ethernet + IPv4 + UDP, both checksums complete."""
    s, d = socket.inet_aton(src[0]), socket.inet_aton(dst[0])
    ulen = 8 + len(payload)
    udp = struct.pack("!HHHH", src[1], dst[1], ulen, 0) + payload
    check = (~_fold(s + d + struct.pack("!BBH", 0, 17, ulen) + udp) & 0xFFFF) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", check) + udp[8:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + ulen, 7, 0x4000, ttl, 17, 0, s, d)
    ip = ip[:10] + struct.pack("!H", ~_fold(ip) & 0xFFFF) + ip[12:]
    return WIRE_MACS[1] + WIRE_MACS[0] + b"\x08\x00" + ip + udp


def parse(out: bytes) -> tuple[bytes, bytes, tuple[str, int], tuple[str, int], int, bytes]:
    """(dst MAC, src MAC, source, destination, TTL, UDP payload); asserts both checksums."""
    ip, udp = out[14:34], out[34:]
    assert _fold(ip) == 0xFFFF, "IP checksum"
    ulen = struct.unpack("!H", udp[4:6])[0]
    assert len(udp) == ulen == struct.unpack("!H", ip[2:4])[0] - 20
    pseudo = ip[12:20] + struct.pack("!BBH", 0, 17, ulen)
    assert _fold(pseudo + udp) == 0xFFFF, "UDP checksum"
    sport, dport = struct.unpack("!HH", udp[:4])
    return (
        out[:6],
        out[6:12],
        (socket.inet_ntoa(ip[12:16]), sport),
        (socket.inet_ntoa(ip[16:20]), dport),
        ip[8],
        udp[8:],
    )


@pytest.fixture
def program() -> Iterator[tuple[int, BpfMap, BpfMap]]:
    obj = BpfObject(default_object_path())
    try:
        yield (
            obj.prog_fd(PROG_TC),
            BpfMap(obj.map_fd("stunner_chan")),
            BpfMap(obj.map_fd("stunner_peer")),
        )
    finally:
        obj.close()


@pytest.mark.parametrize("flags", ["neigh", "macs", "peer-dev"])
def test_both_ways_are_rewritten_byte_for_byte(
    program: tuple[int, BpfMap, BpfMap], flags: str
) -> None:
    prog, chan, peer_map = program
    macs = None if flags == "neigh" else OUT_MACS
    to_peer = fwd(RELAY, PEER, ifindex=1, local=False, macs=macs)
    to_client = fwd(LISTENER, CLIENT, ifindex=1, local=False, channel=CHANNEL, macs=macs)
    if flags == "peer-dev":
        to_peer.flags |= FWD_PEER_DEV
        to_client.flags |= FWD_PEER_DEV
    chan.update(client_key(CLIENT, LISTENER[1], CHANNEL), to_peer)
    peer_map.update(peer_key(PEER, RELAY[1]), to_client)
    expected_macs = (WIRE_MACS[1], WIRE_MACS[0]) if macs is None else (OUT_MACS[1], OUT_MACS[0])

    for size in (1, 160, 161, 1000):
        media = bytes(range(256)) * 4
        data = media[:size]
        out = run_program(prog, frame(CLIENT, LISTENER, struct.pack("!HH", CHANNEL, size) + data))
        assert out.verdict == TC_ACT_REDIRECT
        assert parse(out.packet) == (*expected_macs, RELAY, PEER, 64, data)

        out = run_program(prog, frame(PEER, RELAY, data))
        assert out.verdict == TC_ACT_REDIRECT
        channel_data = struct.pack("!HH", CHANNEL, size) + data
        assert parse(out.packet) == (*expected_macs, LISTENER, CLIENT, 64, channel_data)


def test_a_zero_udp_checksum_stays_zero(program: tuple[int, BpfMap, BpfMap]) -> None:
    prog, chan, _peer = program
    chan.update(client_key(CLIENT, LISTENER[1], CHANNEL), fwd(RELAY, PEER, ifindex=1, local=False))
    packet = bytearray(frame(CLIENT, LISTENER, struct.pack("!HH", CHANNEL, 4) + b"data"))
    packet[40:42] = b"\0\0"  # no UDP checksum (IPv4 allows it)
    out = run_program(prog, bytes(packet))
    assert out.verdict == TC_ACT_REDIRECT
    assert out.packet[40:42] == b"\0\0"
    assert out.packet[42:] == b"data"


@pytest.mark.parametrize(
    "packet",
    [
        frame(CLIENT, LISTENER, struct.pack("!HH", CHANNEL + 1, 4) + b"data"),  # unbound channel
        frame(CLIENT, LISTENER, struct.pack("!HH", CHANNEL, 4) + b"data" + b"\0" * 4),  # padded
        frame(CLIENT, LISTENER, struct.pack("!HHI", 0x0001, 0, 0x2112A442) + bytes(12)),  # STUN
        frame(("10.9.1.3", 50000), RELAY, b"a stranger"),  # a peer without a channel
    ],
    ids=["unbound", "padded", "stun", "stranger"],
)
def test_what_is_not_bound_passes_untouched(
    program: tuple[int, BpfMap, BpfMap], packet: bytes
) -> None:
    prog, chan, peer_map = program
    chan.update(client_key(CLIENT, LISTENER[1], CHANNEL), fwd(RELAY, PEER, ifindex=1, local=False))
    peer_map.update(
        peer_key(PEER, RELAY[1]), fwd(LISTENER, CLIENT, ifindex=1, local=False, channel=CHANNEL)
    )
    out = run_program(prog, packet)
    assert (out.verdict, out.packet) == (TC_ACT_OK, packet)
