"""Where a listener's socket binds, in one place for the listener and for the worker supervisor.

The supervisor of `--udp-thread-num` workers binds every listener's sockets itself (see
`stunnerd.workers.sockets`) and the workers look them up by the same key, so both sides must
agree on the address and the kind of socket a listener config means.
"""

from __future__ import annotations

import socket
from typing import NamedTuple

DUAL_STACK_HOSTS = frozenset({"::", ""})


class SocketKey(NamedTuple):
    """What a listener binds: `kind` is `udp` (TURN-UDP, TURN-DTLS) or `tcp` (TURN-TCP/TLS)."""

    kind: str
    host: str
    port: int


def listener_bind_host(bind_host: str, address: str) -> str:
    """Where a listener binds: `bind_host`, or `::` for an IPv6 listener on an IPv4 host."""
    if ":" in address and ":" not in bind_host:
        return "::"
    return bind_host


def allow_both_families(sock: socket.socket, host: str) -> None:
    """A socket on the IPv6 wildcard `::` takes IPv4 clients too (they show up as ::ffff:a.b.c.d),
    whatever the host's `net.ipv6.bindv6only` says; call before `bind`."""
    if sock.family == socket.AF_INET6 and host in DUAL_STACK_HOSTS:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)


def socket_kind(protocol: str) -> str:
    return "tcp" if protocol in ("TURN-TCP", "TURN-TLS") else "udp"


ACCEPT_BACKLOG = 4096  # bursts of connections wait in the kernel, not in SYN retries


def bind_tcp_server(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A listening, non-blocking TCP socket of a TURN-TCP or TURN-TLS listener; on a wildcard
    host it is `[::]:port` and takes IPv4 clients too (asyncio would make it IPv6-only)."""
    if host in DUAL_STACK_HOSTS:
        host = "::"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        allow_both_families(sock, host)
        sock.bind((host, port))
        sock.listen(ACCEPT_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
