"""Three network namespaces joined by veth pairs, for tests of stunnerd's kernel offload.

    client ns  10.77.1.2 ──veth── 10.77.1.1  server ns  10.77.2.1 ──veth── 10.77.2.2  peer ns

The client and the peer route everything through the server namespace, which does not forward
(IP forwarding stays off): a datagram crosses from one side to the other only if stunnerd, in
user space or in the kernel, relays it. Names carry the test process id, so parallel runs do not
collide; `Topology.close()` deletes the namespaces (their veths go with them).

Creating namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); loading BPF needs CAP_BPF. Where
either is missing the tests skip with the reason, except under CI=true, where they must run.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

CLIENT_IP = "10.77.1.2"
SERVER_CLIENT_IP = "10.77.1.1"
SERVER_PEER_IP = "10.77.2.1"
PEER_IP = "10.77.2.2"
_counter = itertools.count()
SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17
ETHTOOL_SGRO = 0x2C


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"stunprobe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    return None


def require_netns() -> None:
    reason = netns_unavailable()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the offload tests: {reason}")
    pytest.skip(reason)


def _ip(*args: str, ns: str | None = None) -> None:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


@dataclass
class Topology:
    client: str
    server: str
    peer: str
    server_client_if: str  # the server's veth towards the client
    server_peer_if: str  # the server's veth towards the peer

    def argv(self, ns: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", ns, *cmd]

    def python(self, ns: str, *args: str) -> list[str]:
        # -P: a script in tests/support must not shadow the standard library with its
        # neighbours (support/operator.py would hide `operator`)
        return self.argv(ns, sys.executable, "-P", *args)

    def run(self, ns: str, *cmd: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(ns, *cmd), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def close(self) -> None:
        for ns in (self.client, self.server, self.peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def make_topology() -> Topology:
    tag = f"so{os.getpid() % 100000}x{next(_counter)}"
    topo = Topology(
        client=f"{tag}-c",
        server=f"{tag}-s",
        peer=f"{tag}-p",
        server_client_if="to-client",
        server_peer_if="to-peer",
    )
    try:
        for ns in (topo.client, topo.server, topo.peer):
            _ip("netns", "add", ns)
            _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", "eth0", "netns", topo.client, "type", "veth", "peer", "name",
            "to-client", "netns", topo.server)  # fmt: skip
        _ip("link", "add", "eth0", "netns", topo.peer, "type", "veth", "peer", "name",
            "to-peer", "netns", topo.server)  # fmt: skip
        for ns, dev, addr in (
            (topo.client, "eth0", f"{CLIENT_IP}/24"),
            (topo.server, "to-client", f"{SERVER_CLIENT_IP}/24"),
            (topo.server, "to-peer", f"{SERVER_PEER_IP}/24"),
            (topo.peer, "eth0", f"{PEER_IP}/24"),
        ):
            _ip("addr", "add", addr, "dev", dev, ns=ns)
            _ip("link", "set", dev, "up", ns=ns)
        _ip("route", "add", "default", "via", SERVER_CLIENT_IP, ns=topo.client)
        _ip("route", "add", "default", "via", SERVER_PEER_IP, ns=topo.peer)
    except BaseException:
        topo.close()
        raise
    return topo


@contextlib.contextmanager
def topology() -> Iterator[Topology]:
    require_netns()
    topo = make_topology()
    try:
        yield topo
    finally:
        topo.close()


def _ethtool_set(topo: Topology, ns: str, dev: str, cmd: int, on: bool) -> None:
    code = (
        "import fcntl, socket, struct, ctypes, sys\n"
        f"val = ctypes.create_string_buffer(struct.pack('II', {cmd}, {int(on)}))\n"
        "req = struct.pack('16sP', sys.argv[1].encode(), ctypes.addressof(val))\n"
        "with socket.socket() as s:\n"
        f"    fcntl.ioctl(s.fileno(), {SIOCETHTOOL}, req)\n"
    )
    done = topo.run(ns, sys.executable, "-c", code, dev)
    if done.returncode != 0:
        raise RuntimeError(f"ethtool {cmd:#x} on {dev}: {done.stderr.strip()}")


def set_tx_checksum(topo: Topology, ns: str, dev: str, on: bool) -> None:
    """Turn the veth's transmit checksum offload on or off (as `ethtool -K dev tx off`), so the
    datagrams it sends carry a complete UDP checksum instead of a CHECKSUM_PARTIAL seed."""
    _ethtool_set(topo, ns, dev, ETHTOOL_STXCSUM, on)


def set_gro(topo: Topology, ns: str, dev: str, on: bool) -> None:
    """GRO on a veth gives it NAPI, which a frame XDP-redirected to its far end needs."""
    _ethtool_set(topo, ns, dev, ETHTOOL_SGRO, on)


def prime_neighbours(topo: Topology) -> None:
    """Resolve the client's and the peer's MACs in the server namespace (XDP needs them)."""
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "for _ in range(50):\n"
        "    for ip in sys.argv[1:]: s.sendto(b'', (ip, 9))\n"  # the ARP request goes out
        "    arp = open('/proc/net/arp').read()\n"
        "    if all(ip + ' ' in arp and '0x2' in arp for ip in sys.argv[1:]): break\n"
        "    time.sleep(0.05)\n"
    )
    topo.run(topo.server, sys.executable, "-c", code, CLIENT_IP, PEER_IP)


def popen(topo: Topology, ns: str, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(topo.argv(ns, *argv), text=True, **kwargs)  # type: ignore[call-overload]


_FETCH = (
    "import sys, urllib.request\n"
    "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
)


def http_get(topo: Topology, ns: str, url: str) -> str:
    """GET a URL from inside a namespace (stunnerd's /status, /metrics); '' if it fails."""
    done = topo.run(ns, sys.executable, "-c", _FETCH, url, timeout_s=15)
    return done.stdout if done.returncode == 0 else ""
