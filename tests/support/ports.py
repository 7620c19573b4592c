"""Free loopback ports for servers that cannot bind port 0 themselves (external binaries)."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(kind: int = socket.SOCK_STREAM, host: str = LOOPBACK) -> int:
    """Return a port that was free on `host` for `kind` a moment ago.

    Prefer binding port 0 in the code under test; this is for programs such as redis-server or
    coturn that need a number on their command line.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, kind) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_udp_tcp_port(host: str = LOOPBACK) -> int:
    """Return a port number free for both UDP and TCP on `host` (TURN servers bind both)."""
    for _ in range(50):
        port = free_port(socket.SOCK_DGRAM, host)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as tcp:
            try:
                tcp.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no port free for both UDP and TCP")


def ipv6_loopback_available() -> bool:
    """Whether this host has ::1 (IPv6 tests skip with that reason where it has not)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True
