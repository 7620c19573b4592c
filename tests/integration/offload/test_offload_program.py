"""The BPF program on real veths, driven through its maps only (no TURN server running).

Nothing listens on the listener or relay ports in the server namespace and it does not forward,
so every datagram that arrives was relayed by the kernel program. Checksums are verified on the
receiving side from a packet capture, with the senders' checksum offload turned off so that what
went in carried a complete checksum.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import netns
from support.netns import CLIENT_IP, PEER_IP, SERVER_CLIENT_IP, SERVER_PEER_IP, Topology

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DRIVER = str(Path(__file__).parents[2] / "support" / "offload_driver.py")
LISTENER = ("0.0.0.0", 3478)
RELAY = ("0.0.0.0", 49170)
CLIENT = (CLIENT_IP, 40000)
PEER = (PEER_IP, 50000)
CHANNEL = 0x4001


class Driver:
    def __init__(self, topo: Topology) -> None:
        self.proc = subprocess.Popen(
            topo.python(topo.server, DRIVER),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def __call__(self, op: str, **kw: object) -> dict[str, object]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            assert self.proc.stderr is not None
            pytest.fail(f"offload driver died: {self.proc.stderr.read()}")
        answer: dict[str, object] = json.loads(line)
        assert answer["ok"], answer
        return answer

    def channel(self, op: str, peer: tuple[str, int] = PEER) -> dict[str, object]:
        return self(op, client=CLIENT, listener=LISTENER, channel=CHANNEL, peer=peer, relay=RELAY)

    def close(self) -> None:
        if self.proc.poll() is None:
            self("close")
            self.proc.wait(10)


@pytest.fixture
def topo() -> Iterator[Topology]:
    with netns.topology() as t:
        yield t


@pytest.fixture
def driver(topo: Topology) -> Iterator[Driver]:
    d = Driver(topo)
    try:
        d("open")
        yield d
    finally:
        d.close()
        if d.proc.poll() is None:
            d.proc.kill()


# The exchange runs in the client and peer namespaces as two small scripts: the peer captures
# (AF_PACKET) and answers; the client sends ChannelData and reads what comes back.
PEER_SCRIPT = r"""
import json, socket, struct, sys
def csum(data):
    if len(data) % 2: data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return s
def udp_ok(frame):
    ip = frame[14:34]; udp = frame[34:]
    ulen = struct.unpack("!H", udp[4:6])[0]
    if struct.unpack("!H", udp[6:8])[0] == 0: return "none"
    pseudo = ip[12:20] + struct.pack("!BBH", 0, 17, ulen)
    return csum(ip[:20]) == 0xffff and csum(pseudo + udp[:ulen]) == 0xffff
count, port, reply = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
raw.settimeout(5)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("0.0.0.0", port)); sock.settimeout(5)
print("ready", flush=True)
got, sources, checks = [], set(), []
for _ in range(count):
    data, src = sock.recvfrom(4096)
    got.append(data.hex()); sources.add("%s:%d" % src)
    sock.sendto(b"re:" + data, (reply, src[1]) if reply != "-" else src)
raw.settimeout(0.5)
try:
    while True:
        f = raw.recv(65536)
        if f[23] == 17 and struct.unpack("!H", f[36:38])[0] == port:
            checks.append(udp_ok(f))
except OSError:
    pass
print(json.dumps({"got": got, "sources": sorted(sources), "checks": checks}), flush=True)
"""

CLIENT_SCRIPT = r"""
import json, socket, struct, sys
count, size, chan, server = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("0.0.0.0", 40000)); sock.settimeout(5)
answers, sources = [], set()
for i in range(count):
    payload = bytes([i % 256]) * (size + i % 3)
    sock.sendto(struct.pack("!HH", chan, len(payload)) + payload, (server, 3478))
    data, src = sock.recvfrom(4096)
    answers.append(data.hex()); sources.add("%s:%d" % src)
print(json.dumps({"answers": answers, "sources": sorted(sources)}), flush=True)
"""


def exchange(
    topo: Topology, count: int = 20, size: int = 160, peer_ns: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    peer = subprocess.Popen(
        topo.python(peer_ns or topo.peer, "-c", PEER_SCRIPT, str(count), str(PEER[1]), "-"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert peer.stdout is not None
        assert peer.stdout.readline().strip() == "ready", peer.stderr
        client = topo.run(
            topo.client,
            sys.executable,
            "-c",
            CLIENT_SCRIPT,
            str(count),
            str(size),
            str(CHANNEL),
            SERVER_CLIENT_IP,
        )
        peer_out, peer_err = peer.communicate(timeout=30)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
    assert client.returncode == 0, client.stderr
    assert peer.returncode == 0, peer_err
    return json.loads(client.stdout), json.loads(peer_out)


def expected(i: int, size: int = 160) -> bytes:
    return bytes([i % 256]) * (size + i % 3)


def check_relayed(
    client: dict[str, Any], peer: dict[str, Any], count: int = 20, size: int = 160
) -> None:
    assert [bytes.fromhex(g) for g in peer["got"]] == [expected(i, size) for i in range(count)]
    assert peer["sources"] == [f"{SERVER_PEER_IP}:{RELAY[1]}"]
    assert client["sources"] == [f"{SERVER_CLIENT_IP}:{LISTENER[1]}"]
    for i, hexed in enumerate(client["answers"]):
        frame = bytes.fromhex(hexed)
        body = b"re:" + expected(i, size)
        assert frame == struct.pack("!HH", CHANNEL, len(body)) + body


def test_channel_data_is_relayed_both_ways_by_tc_with_right_checksums(
    topo: Topology, driver: Driver
) -> None:
    for ns in (topo.client, topo.peer):
        netns.set_tx_checksum(topo, ns, "eth0", on=False)
    driver("attach", engine="TC", interfaces=[topo.server_client_if, topo.server_peer_if])
    driver.channel("put")
    client, peer = exchange(topo)
    check_relayed(client, peer)
    assert peer["checks"], peer
    assert all(c is True for c in peer["checks"]), peer["checks"]
    counters: Any = driver.channel("counters")
    payload = sum(len(expected(i)) for i in range(20))
    assert counters["to_peer"] == [20, payload]
    assert counters["to_client"] == [20, payload + 3 * 20]


def test_locally_generated_partial_checksums_still_arrive(topo: Topology, driver: Driver) -> None:
    """With the veths' default checksum offload the senders hand over CHECKSUM_PARTIAL skbs."""
    driver("attach", engine="TC", interfaces=[])
    driver.channel("put")
    client, peer = exchange(topo, size=1000)
    check_relayed(client, peer, size=1000)


def test_a_deleted_channel_is_no_longer_relayed(topo: Topology, driver: Driver) -> None:
    driver("attach", engine="TC", interfaces=[])
    driver.channel("put")
    check_relayed(*exchange(topo, count=3), count=3)
    assert driver.channel("delete")["deleted"] == [True, True]
    assert driver("count")["entries"] == [0, 0]
    with pytest.raises(AssertionError):
        exchange(topo, count=1)  # nothing in user space either: the datagram is gone


def test_detach_leaves_the_interfaces_untouched(topo: Topology, driver: Driver) -> None:
    driver("attach", engine="TC", interfaces=[topo.server_client_if])
    driver("detach")
    done = topo.run(topo.server, "tc", "filter", "show", "dev", topo.server_client_if, "ingress")
    assert "stunner_tc" not in done.stdout


def test_a_leftover_program_from_a_crashed_run_is_replaced(topo: Topology) -> None:
    first = Driver(topo)
    first("open")
    first("attach", engine="TC", interfaces=[topo.server_client_if])
    first.channel("put")
    first.proc.kill()  # a crash: the filter and its maps stay in the kernel
    first.proc.wait()
    shown = topo.run(topo.server, "tc", "filter", "show", "dev", topo.server_client_if, "ingress")
    assert "stunner_tc" in shown.stdout
    old_id = re.search(r"stunner_tc:\[(\d+)\]", shown.stdout)
    second = Driver(topo)
    try:
        second("open")
        second("attach", engine="TC", interfaces=[topo.server_client_if])
        shown = topo.run(
            topo.server, "tc", "filter", "show", "dev", topo.server_client_if, "ingress"
        )
        assert shown.stdout.count("handle 0x57a1") == 1
        new_id = re.search(r"stunner_tc:\[(\d+)\]", shown.stdout)
        assert old_id
        assert new_id
        assert old_id.group(1) != new_id.group(1)
        with pytest.raises(AssertionError):  # the old channel is not relayed any more
            exchange(topo, count=1)
    finally:
        second.close()


def test_a_peer_on_this_host_is_left_to_user_space_one_way_and_relayed_the_other(
    topo: Topology, driver: Driver
) -> None:
    """Towards a local peer the datagram goes up to user space (here a relay socket stands in);
    the local peer's answer, seen on lo, is relayed by the kernel to the client."""
    driver("attach", engine="TC", interfaces=[])
    local_peer = (SERVER_PEER_IP, PEER[1])
    driver.channel("put", peer=local_peer)
    script = (
        "import socket, struct\n"
        "relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"relay.bind(('0.0.0.0', {RELAY[1]}))\n"
        "listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "listener.bind(('0.0.0.0', 3478)); listener.settimeout(5)\n"
        "peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"peer.bind(('0.0.0.0', {PEER[1]}))\n"
        "print('ready', flush=True)\n"
        "for _ in range(5):\n"
        "    frame, client = listener.recvfrom(4096)\n"  # user space strips the header ...
        f"    relay.sendto(frame[4:], ('{SERVER_PEER_IP}', {PEER[1]}))\n"
        "    data, src = peer.recvfrom(4096)\n"  # ... the peer answers the relay address
        "    peer.sendto(b're:' + data, src)\n"
    )
    stand_in = subprocess.Popen(
        topo.python(topo.server, "-c", script), stdout=subprocess.PIPE, text=True
    )
    try:
        assert stand_in.stdout is not None
        assert stand_in.stdout.readline().strip() == "ready"
        client = topo.run(
            topo.client, sys.executable, "-c", CLIENT_SCRIPT, "5", "160", str(CHANNEL),
            SERVER_CLIENT_IP,
        )  # fmt: skip
        assert client.returncode == 0, client.stderr
        stand_in.wait(10)
    finally:
        if stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait()
    answers = json.loads(client.stdout)
    for i, hexed in enumerate(answers["answers"]):
        body = b"re:" + expected(i)
        assert bytes.fromhex(hexed) == struct.pack("!HH", CHANNEL, len(body)) + body
    counters = driver.channel("counters", peer=local_peer)
    assert counters["to_peer"] == [0, 0]
    assert counters["to_client"][0] == 5  # type: ignore[index]


# Datagrams the program must hand to user space unchanged, sent to sockets bound in the server
# namespace on the listener and relay ports.
CATCH_SCRIPT = r"""
import json, select, socket, sys
socks = []
for port in (3478, 49170):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port)); socks.append(s)
print("ready", flush=True)
got = []
while len(got) < int(sys.argv[1]):
    ready, _, _ = select.select(socks, [], [], 5)
    if not ready: break
    for s in ready:
        data, src = s.recvfrom(4096)
        got.append([s.getsockname()[1], "%s:%d" % src, data.hex()])
print(json.dumps(got), flush=True)
"""


def test_what_the_program_does_not_handle_reaches_user_space_untouched(
    topo: Topology, driver: Driver
) -> None:
    driver("attach", engine="TC", interfaces=[])
    driver.channel("put")
    stun = bytes.fromhex("000100002112a442") + bytes(12)  # a Binding request
    unbound = struct.pack("!HH", 0x4002, 4) + b"abcd"  # a channel nobody bound
    padded = struct.pack("!HH", CHANNEL, 3) + b"abc\0"  # bound, but padded to 4 bytes
    from_client = [stun, unbound, padded]
    from_other_port = b"hello relay"  # the peer's address, another source port
    catcher = subprocess.Popen(
        topo.python(topo.server, "-c", CATCH_SCRIPT, str(len(from_client) + 1)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert catcher.stdout is not None
        assert catcher.stdout.readline().strip() == "ready"
        send = "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        send += "s.bind(('0.0.0.0', int(sys.argv[1])))\n"
        send += (
            "for h in sys.argv[4:]: s.sendto(bytes.fromhex(h), (sys.argv[2], int(sys.argv[3])))\n"
        )
        sent = topo.run(
            topo.client, sys.executable, "-c", send, str(CLIENT[1]), SERVER_CLIENT_IP, "3478",
            *(d.hex() for d in from_client),
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        sent = topo.run(
            topo.peer, sys.executable, "-c", send, str(PEER[1] + 1), SERVER_PEER_IP,
            str(RELAY[1]), from_other_port.hex(),
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        out, err = catcher.communicate(timeout=30)
    finally:
        if catcher.poll() is None:
            catcher.kill()
            catcher.wait()
    got = json.loads(out)
    assert sorted(got) == sorted(
        [[3478, f"{CLIENT_IP}:{CLIENT[1]}", d.hex()] for d in from_client]
        + [[RELAY[1], f"{PEER_IP}:{PEER[1] + 1}", from_other_port.hex()]]
    ), err
    assert driver.channel("counters")["to_peer"] == [0, 0]


def test_channel_data_is_relayed_both_ways_by_native_xdp(topo: Topology, driver: Driver) -> None:
    for ns in (topo.client, topo.peer):
        netns.set_tx_checksum(topo, ns, "eth0", on=False)
        netns.set_gro(topo, ns, "eth0", on=True)
    netns.prime_neighbours(topo)
    modes = driver("attach", engine="XDP", interfaces=[topo.server_client_if, topo.server_peer_if])
    assert modes["modes"] == {topo.server_client_if: "XDP", topo.server_peer_if: "XDP"}
    driver.channel("put")
    client, peer = exchange(topo)
    check_relayed(client, peer)
    assert peer["checks"], peer
    assert all(c is True for c in peer["checks"]), peer["checks"]
    counters: Any = driver.channel("counters")
    assert counters["to_peer"][0] == 20
    assert counters["to_client"][0] == 20


def test_xdp_cannot_fix_the_partial_checksums_of_a_local_sender_behind_a_veth(
    topo: Topology, driver: Driver
) -> None:
    """Why `Auto` keeps veths on TC: XDP sees only the CHECKSUM_PARTIAL seed of a local sender,
    updates it incrementally, and the receiver drops the result (TC gets it right, above)."""
    netns.set_gro(topo, topo.peer, "eth0", on=True)
    netns.prime_neighbours(topo)
    driver("attach", engine="XDP", interfaces=[topo.server_client_if, topo.server_peer_if])
    driver.channel("put")
    with pytest.raises(AssertionError):
        exchange(topo, count=1)
    assert driver.channel("counters")["to_peer"] == [1, 160]


CATCH6_SCRIPT = r"""
import json, socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(("::", 3478)); s.settimeout(5)
print("ready", flush=True)
data, src = s.recvfrom(4096)
print(json.dumps([src[0], src[1], data.hex()]), flush=True)
"""


@pytest.mark.parametrize("engine", ["TC", "XDP"])
def test_ipv6_channel_data_reaches_user_space_untouched(
    topo: Topology, driver: Driver, engine: str
) -> None:
    for ns, dev, addr in (
        (topo.client, "eth0", "fd77:1::2/64"),
        (topo.server, "to-client", "fd77:1::1/64"),
    ):
        done = topo.run(ns, "ip", "-6", "addr", "add", addr, "dev", dev, "nodad")
        assert done.returncode == 0, done.stderr
    if engine == "XDP":
        for ns in (topo.client, topo.peer):  # a veth needs XDP on the far end to receive it
            netns.set_gro(topo, ns, "eth0", on=True)
    driver("attach", engine=engine, interfaces=["to-client"])
    driver.channel("put")  # the same client port and channel, over IPv4
    frame = struct.pack("!HH", CHANNEL, 8) + b"over ip6"
    catcher = subprocess.Popen(
        topo.python(topo.server, "-c", CATCH6_SCRIPT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert catcher.stdout is not None
        assert catcher.stdout.readline().strip() == "ready"
        send = (
            "import socket, sys\ns = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
            "s.bind(('::', int(sys.argv[1])))\n"
            "s.sendto(bytes.fromhex(sys.argv[2]), ('fd77:1::1', 3478))\n"
        )
        sent = topo.run(topo.client, sys.executable, "-c", send, str(CLIENT[1]), frame.hex())
        assert sent.returncode == 0, sent.stderr
        out, err = catcher.communicate(timeout=30)
    finally:
        if catcher.poll() is None:
            catcher.kill()
            catcher.wait()
    assert json.loads(out) == ["fd77:1::2", CLIENT[1], frame.hex()], err
    assert driver.channel("counters")["to_peer"] == [0, 0]


@pytest.mark.parametrize("partial", [False, True], ids=["complete", "partial-checksums"])
def test_tc_sends_on_the_resolved_macs_without_the_neighbour_table(
    topo: Topology, driver: Driver, partial: bool
) -> None:
    """Entries that carry the MACs resolved when they were put go out with `bpf_redirect`: the
    server's neighbour entries, pointed elsewhere afterwards, are not consulted."""
    for ns in (topo.client, topo.peer):
        netns.set_tx_checksum(topo, ns, "eth0", on=partial)
    netns.prime_neighbours(topo)
    driver("attach", engine="TC", interfaces=[topo.server_client_if, topo.server_peer_if])
    driver.channel("put")
    for ip, dev in ((CLIENT_IP, topo.server_client_if), (PEER_IP, topo.server_peer_if)):
        topo.run(topo.server, "ip", "neigh", "replace", ip, "lladdr", "02:00:00:00:00:99",
                 "dev", dev, "nud", "permanent")  # fmt: skip
    client, peer = exchange(topo)
    check_relayed(client, peer)
    if not partial:
        assert peer["checks"], peer
        assert all(c is True for c in peer["checks"]), peer["checks"]
    counters: Any = driver.channel("counters")
    assert counters["to_peer"][0] == 20
