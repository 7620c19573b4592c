"""How a listener's socket is bound, for the listener and for the worker supervisor.

Where it binds, and the key the supervisor's workers look it up by, is the contract
`stunner_common.contracts.socket_key`; this module holds the socket options both sides set.
"""

from __future__ import annotations

import socket

DUAL_STACK_HOSTS = frozenset({"::", ""})


def allow_both_families(sock: socket.socket, host: str) -> None:
    """A socket on the IPv6 wildcard `::` takes IPv4 clients too (they show up as ::ffff:a.b.c.d),
    whatever the host's `net.ipv6.bindv6only` says; call before `bind`."""
    if sock.family == socket.AF_INET6 and host in DUAL_STACK_HOSTS:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)


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
