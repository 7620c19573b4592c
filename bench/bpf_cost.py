"""What the offload program costs per packet, apart from everything around it.

    python -m bench.bpf_cost [OBJECT ...]

Loads each object (default: the one stunnerd loads), fills its maps with three entries that
make a relayed packet a relayable packet again, and runs its TC program on one ChannelData
datagram through BPF_PROG_TEST_RUN, `REPEAT` times in the kernel per call: the packet goes
client -> peer (ChannelData unwrapped), peer -> client (wrapped), and round again, so every run
is a relay, half of each direction. Prints per object the least nanoseconds per run over
`CALLS` calls (the kernel's own clock around its loop, no syscall in it; the least is the call
no other tenant disturbed) and the program's size
in instructions after the verifier's rewrites (`bpftool prog dump xlated`): the second is exact,
the first steady enough on a busy machine to compare two objects run side by side.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import sys
from pathlib import Path
from typing import Any

from bench.offload_probe import xlated_insns
from stunnerd.offload.datapath import PROG_TC, default_object_path
from stunnerd.offload.libbpf import BpfMap, BpfObject, Libbpf, OffloadError, run_program
from stunnerd.offload.maps import client_key, fwd, peer_key

REPEAT = 1000
CALLS = 200
PAYLOAD = 160
CHANNEL = 0x4001
CLIENT, LISTENER = ("10.0.0.2", 40000), ("10.0.0.1", 3478)
RELAY, PEER = ("10.0.1.1", 49170), ("10.0.1.2", 50000)
MACS = (b"\x02\x00\x00\x00\x00\x01", b"\x02\x00\x00\x00\x00\x02")


def _csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def channel_data_frame() -> bytes:
    """Ethernet + IPv4 + UDP with a full checksum, carrying ChannelData from CLIENT."""
    body = struct.pack("!HH", CHANNEL, PAYLOAD) + bytes(range(PAYLOAD))
    src, dst = socket.inet_aton(CLIENT[0]), socket.inet_aton(LISTENER[0])
    ulen = 8 + len(body)
    udp = struct.pack("!HHHH", CLIENT[1], LISTENER[1], ulen, 0) + body
    check = _csum(src + dst + struct.pack("!BBH", 0, 17, ulen) + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", check) + udp[8:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + ulen, 0, 0x4000, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", _csum(ip)) + ip[12:]
    return MACS[1] + MACS[0] + b"\x08\x00" + ip + udp


def fill_cycle(obj: BpfObject) -> None:
    """client -> peer, peer -> client, and the client's frame seen again as a client's."""
    chan, peer = BpfMap(obj.map_fd("stunner_chan")), BpfMap(obj.map_fd("stunner_peer"))
    to_peer = fwd(RELAY, PEER, ifindex=1, local=False, macs=MACS)
    chan.update(client_key(CLIENT, LISTENER[1], CHANNEL), to_peer)
    chan.update(client_key(LISTENER, CLIENT[1], CHANNEL), to_peer)
    to_client = fwd(LISTENER, CLIENT, ifindex=1, local=False, channel=CHANNEL, macs=MACS)
    peer.update(peer_key(RELAY, PEER[1]), to_client)


def ns_per_run(prog_fd: int, frame: bytes) -> tuple[float, int]:
    """The least ns per run over CALLS calls of REPEAT runs, and the last call's verdict."""
    runs = [run_program(prog_fd, frame, REPEAT) for _ in range(CALLS)]
    return min(r.ns_per_run for r in runs), runs[-1].verdict


def _prog_id(prog_fd: int) -> int:
    info = ctypes.create_string_buffer(256)
    size = ctypes.c_uint32(256)
    if Libbpf.get().lib.bpf_obj_get_info_by_fd(prog_fd, info, ctypes.byref(size)):
        raise OffloadError("bpf_obj_get_info_by_fd failed")
    return int(struct.unpack_from("=I", info.raw, 4)[0])  # struct bpf_prog_info: type, id


def measure(path: str) -> dict[str, Any]:
    obj = BpfObject(path)
    try:
        fill_cycle(obj)
        prog_fd = obj.prog_fd(PROG_TC)
        ns, retval = ns_per_run(prog_fd, channel_data_frame())
        return {"object": path, "ns_per_run": ns, "retval": retval,
                "xlated_insns": xlated_insns(_prog_id(prog_fd))}  # fmt: skip
    finally:
        obj.close()


def main(argv: list[str] | None = None) -> None:
    paths = (argv if argv is not None else sys.argv[1:]) or [default_object_path()]
    for path in paths:
        if not Path(path).exists():
            print(f"{path}: missing")
            continue
        r = measure(path)
        print(
            f"{r['object']}: TC relay {r['ns_per_run']:.0f} ns/run, "
            f"{r['xlated_insns']} xlated insns, last verdict {r['retval']}"
        )


if __name__ == "__main__":
    main()
