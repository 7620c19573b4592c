"""The BPF maps' keys and values, as ctypes structures: declared here once, for every user.

They mirror `struct client_key`, `struct peer_key` and `struct fwd` of
`services/stunnerd/bpf/stunner_offload.bpf.c`; a test compares every field's offset and size
with the object's BTF (`libbpf.btf_struct`), so a change on one side only fails there, not as
silently misread entries in the kernel.
"""

from __future__ import annotations

import ctypes
import socket

Address = tuple[str, int]
FWD_LOCAL = 1  # the destination is an address of this host: that direction stays in user space
FWD_HAS_MACS = 2  # smac/dmac resolved: XDP may send it, TC sends it without a neighbour lookup
FWD_PEER_DEV = 4  # ifindex is a veth (netkit) with its far end in another namespace: TC hands
# the frame straight to that end (bpf_redirect_peer)
# Addresses are byte arrays, not `c_char` ones: ctypes stores a `c_char` array only up to its
# first zero byte, which would turn 10.0.0.5 into 10.0.0.0 and a MAC 00:… into zeros.
_IP4 = ctypes.c_ubyte * 4
_MAC = ctypes.c_ubyte * 6


def _ip4(ip: str) -> ctypes.Array[ctypes.c_ubyte]:
    return _IP4.from_buffer_copy(socket.inet_aton(ip))


class ClientKey(ctypes.Structure):
    _fields_ = [
        ("client_ip", _IP4),
        ("client_port", ctypes.c_uint16),  # network order
        ("local_port", ctypes.c_uint16),  # network order
        ("channel", ctypes.c_uint16),
        ("pad", ctypes.c_uint16),
    ]


class PeerKey(ctypes.Structure):
    _fields_ = [
        ("peer_ip", _IP4),
        ("peer_port", ctypes.c_uint16),
        ("relay_port", ctypes.c_uint16),
    ]


class Fwd(ctypes.Structure):
    _fields_ = [
        ("src_ip", _IP4),
        ("dst_ip", _IP4),
        ("src_port", ctypes.c_uint16),
        ("dst_port", ctypes.c_uint16),
        ("channel", ctypes.c_uint16),
        ("flags", ctypes.c_uint16),
        ("ifindex", ctypes.c_uint32),
        ("smac", _MAC),
        ("dmac", _MAC),
        ("pad", ctypes.c_uint32),
        ("packets", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
    ]


BTF_STRUCTS: tuple[tuple[type[ctypes.Structure], str], ...] = (
    (ClientKey, "client_key"),
    (PeerKey, "peer_key"),
    (Fwd, "fwd"),
)
"""Each structure and its name in the object's BTF."""


def client_key(client: Address, local_port: int, channel: int) -> ClientKey:
    return ClientKey(
        client_ip=_ip4(client[0]),
        client_port=socket.htons(client[1]),
        local_port=socket.htons(local_port),
        channel=channel,
    )


def peer_key(peer: Address, relay_port: int) -> PeerKey:
    return PeerKey(
        peer_ip=_ip4(peer[0]),
        peer_port=socket.htons(peer[1]),
        relay_port=socket.htons(relay_port),
    )


def fwd(
    src: Address,
    dst: Address,
    *,
    ifindex: int,
    local: bool,
    channel: int = 0,
    macs: tuple[bytes, bytes] | None = None,
    peer_dev: bool = False,
) -> Fwd:
    flags = (FWD_LOCAL if local else 0) | (FWD_HAS_MACS if macs else 0)
    value = Fwd(
        src_ip=_ip4(src[0]),
        dst_ip=_ip4(dst[0]),
        src_port=socket.htons(src[1]),
        dst_port=socket.htons(dst[1]),
        channel=channel,
        flags=flags | (FWD_PEER_DEV if macs and peer_dev else 0),
        ifindex=ifindex,
    )
    if macs:
        value.smac, value.dmac = (_MAC.from_buffer_copy(mac) for mac in macs)
    return value


def destination(value: Fwd) -> Address:
    """Where an entry sends to (its new outer destination)."""
    return socket.inet_ntoa(bytes(value.dst_ip)), socket.ntohs(value.dst_port)
