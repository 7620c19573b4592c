"""Where the kernel would send a datagram: one netlink route query per destination (IPv4).

The BPF program writes packets that this host would have sent from a UDP socket, so it needs
what the socket layer would have chosen: the source address, the egress interface and, for XDP,
the MAC addresses of this end and of the next hop, from `/proc/net/arp`: with them TC sends
with `bpf_redirect` (a veth whose far end is in another namespace, `peer_in_other_namespace`:
`bpf_redirect_peer`), without them with `bpf_redirect_neigh`; XDP passes packets to user space
while there are none (the user-space relay's own traffic resolves them).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

NETLINK_ROUTE = 0
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
RTM_GETLINK, RTM_NEWLINK = 18, 16
IFLA_LINKINFO, IFLA_INFO_KIND, IFLA_LINK_NETNSID = 18, 1, 37
PEER_DEVICE_KINDS = (b"veth", b"netkit")
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PREFSRC = 1, 4, 5, 7
RTN_UNICAST, RTN_LOCAL = 1, 2
_NLMSG = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTATTR = struct.Struct("=HH")
NETLINK_TIMEOUT_S = 1.0


class RouteError(Exception):
    """No usable route to the address."""


@dataclass(frozen=True, slots=True)
class Route:
    dst: str
    src: str  # the source address a socket would use
    ifindex: int  # egress interface (lo for this host's own addresses)
    local: bool  # the destination is an address of this host
    gateway: str | None = None

    @property
    def next_hop(self) -> str:
        return self.gateway or self.dst


def _ask(msg: bytes) -> bytes:
    """One netlink request to the kernel's routing side, and its answer."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.settimeout(NETLINK_TIMEOUT_S)
        sock.sendto(msg, (0, 0))
        return sock.recv(65536)


def _attr(kind: int, data: bytes) -> bytes:
    length = _RTATTR.size + len(data)
    return _RTATTR.pack(length, kind) + data + b"\0" * (-length % 4)


def lookup(dst: str) -> Route:
    """Ask the kernel's FIB, as `ip route get DST` does."""
    if ipaddress.ip_address(dst).version != 4:
        raise RouteError(f"{dst}: only IPv4 is offloaded")
    body = _RTMSG.pack(socket.AF_INET, 32, 0, 0, 0, 0, 0, 0, 0)
    body += _attr(RTA_DST, socket.inet_aton(dst))
    msg = _NLMSG.pack(_NLMSG.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, 1, 0) + body
    reply = _ask(msg)
    length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(reply)
    if kind == NLMSG_ERROR:
        code = -struct.unpack_from("=i", reply, _NLMSG.size)[0]
        raise RouteError(f"no route to {dst}: {socket.errno.errorcode.get(code, code)}")  # type: ignore[attr-defined]
    if kind != RTM_NEWROUTE:
        raise RouteError(f"unexpected netlink answer {kind} for {dst}")
    rt_type = _RTMSG.unpack_from(reply, _NLMSG.size)[7]
    attrs = _attrs(reply, _NLMSG.size + _RTMSG.size, length)
    if rt_type not in (RTN_UNICAST, RTN_LOCAL) or RTA_OIF not in attrs:
        raise RouteError(f"{dst}: route type {rt_type} is not offloaded")
    src = socket.inet_ntoa(attrs[RTA_PREFSRC]) if RTA_PREFSRC in attrs else _source_for(dst)
    gateway = socket.inet_ntoa(attrs[RTA_GATEWAY]) if RTA_GATEWAY in attrs else None
    return Route(
        dst=dst,
        src=src,
        ifindex=struct.unpack("=i", attrs[RTA_OIF])[0],
        local=rt_type == RTN_LOCAL,
        gateway=gateway,
    )


def _attrs(buf: bytes, pos: int, end: int) -> dict[int, bytes]:
    """Netlink attributes from `pos` to `end`, by type (the last of a repeated type)."""
    attrs: dict[int, bytes] = {}
    while pos + _RTATTR.size <= end:
        alen, akind = _RTATTR.unpack_from(buf, pos)
        if alen < _RTATTR.size:
            break
        attrs[akind & 0x7FFF] = buf[pos + _RTATTR.size : pos + alen]  # without NLA_F_NESTED
        pos += (alen + 3) & ~3
    return attrs


def peer_in_other_namespace(ifindex: int) -> bool:
    """Whether the interface is a veth (or netkit) whose other end lives in another network
    namespace, as `ip -d link` shows by `link-netnsid`: the TC program may then hand frames
    straight to that end (`bpf_redirect_peer`)."""
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, ifindex, 0, 0)
    msg = _NLMSG.pack(_NLMSG.size + len(body), RTM_GETLINK, NLM_F_REQUEST, 1, 0) + body
    try:
        reply = _ask(msg)
    except OSError:
        return False
    length, kind = _NLMSG.unpack_from(reply)[:2]
    if kind != RTM_NEWLINK:
        return False
    attrs = _attrs(reply, _NLMSG.size + _IFINFOMSG.size, length)
    info = attrs.get(IFLA_LINKINFO, b"")
    link_kind = _attrs(info, 0, len(info)).get(IFLA_INFO_KIND, b"").rstrip(b"\0")
    return link_kind in PEER_DEVICE_KINDS and IFLA_LINK_NETNSID in attrs


def _source_for(dst: str) -> str:
    """The source address a UDP socket connected to `dst` gets (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((dst, 9))
        return str(sock.getsockname()[0])


def interface_mac(ifindex: int) -> bytes | None:
    try:
        name = socket.if_indextoname(ifindex)
        text = Path(f"/sys/class/net/{name}/address").read_text().strip()
        return bytes.fromhex(text.replace(":", ""))
    except (OSError, ValueError):
        return None


def neighbour_mac(ip: str, ifindex: int) -> bytes | None:
    """The resolved MAC of `ip` on the interface, from the ARP table, or None."""
    try:
        name = socket.if_indextoname(ifindex)
        lines = Path("/proc/net/arp").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # IP address, HW type, Flags, HW address, Mask, Device; flags 0x2 = ATF_COM (complete)
        if len(fields) >= 6 and fields[0] == ip and fields[5] == name and int(fields[2], 16) & 2:
            return bytes.fromhex(fields[3].replace(":", ""))
    return None
