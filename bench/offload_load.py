"""The client side of `python -m bench offload`, run inside the client network namespace.

    python -m bench.offload_load UDP_LOAD SERVER_IP PORT PEER_IP PEER_PORT COUNT PPS MESSAGES
        [--direct]

Opens COUNT allocations (Allocate with long-term credentials, ChannelBind 0x4000 to the peer,
each from its own socket), hands the sockets to the compiled `udp_load gen` for the load itself
(whose output, a "start" line and one JSON line, goes straight to ours), then ends the
allocations with Refresh 0. With `--direct` there is no TURN at all: plain sockets send to the
peer, for the IP-forwarding reference run.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

from bench.media_rate import CHANNEL, close_allocations, open_allocations

STRAGGLERS_MS = 1000
PAYLOAD = 160


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("udp_load")
    parser.add_argument("server_ip")
    parser.add_argument("port", type=int)
    parser.add_argument("peer_ip")
    parser.add_argument("peer_port", type=int)
    parser.add_argument("count", type=int)
    parser.add_argument("pps", type=int)
    parser.add_argument("messages", type=int)
    parser.add_argument("--direct", action="store_true")
    args = parser.parse_args()
    server, peer = (args.server_ip, args.port), (args.peer_ip, args.peer_port)
    if args.direct:
        socks = []
        for _ in range(args.count):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("0.0.0.0", 0))
            socks.append(s)
        dst, channel = peer, 0
    else:
        try:
            socks = open_allocations(args.count, server, peer, local_ip="0.0.0.0")
        except RuntimeError as exc:
            print(f"error: {exc}", flush=True)
            return 1
        dst, channel = server, CHANNEL
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
    fds = [s.fileno() for s in socks]
    argv = [args.udp_load, "gen", dst[0], str(dst[1]), str(channel), str(PAYLOAD)]
    argv += [str(args.pps), str(args.messages), str(STRAGGLERS_MS), *map(str, fds)]
    sys.stdout.flush()
    done = subprocess.run(argv, pass_fds=fds, check=False)
    if not args.direct:
        close_allocations(socks, server)
    for s in socks:
        s.close()
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
