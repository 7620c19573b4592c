"""Free loopback ports for servers that cannot bind port 0 themselves (external binaries)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

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


# The ports the services default to and those `make run` takes (scripts/run_local.py): stunnerd's
# health (8086, 8087, ...) and metrics (8080, 9086), the operator's health (8081) and metrics
# (8080), the CDS (13478), the auth service (8088), Redis (6379, and 16379 under `make run`), the
# browser call (8090), TURN (3478, 3479, 5349) and the UDP echo backend (9001); 9090 and 9443
# (Prometheus, webhooks) for good measure.
DEFAULT_TCP_PORTS = (
    3478,
    3479,
    5349,
    6379,
    8080,
    8081,
    8086,
    8087,
    8088,
    8090,
    9086,
    9090,
    9443,
    13478,
    16379,
)
DEFAULT_UDP_PORTS = (3478, 3479, 5349, 9001)


@contextlib.contextmanager
def default_ports_held(host: str = LOOPBACK) -> Iterator[list[tuple[int, int]]]:
    """Hold the default ports on `host`, as a running `make run` stack would, for a test run.

    A test that starts a server on a default port then fails at once ("address already in use")
    on every machine, not only on one where `make run` happens to be up. The sockets are bound
    but never listen: a client that connects is refused, as if nothing were there; no socket
    option allows sharing the port. A port some other program already holds is left to it (it
    is just as taken). Yields the (port, socket type) pairs this holds.
    """
    held: list[tuple[int, int]] = []
    with contextlib.ExitStack() as stack:
        for kind, ports in (
            (socket.SOCK_STREAM, DEFAULT_TCP_PORTS),
            (socket.SOCK_DGRAM, DEFAULT_UDP_PORTS),
        ):
            for port in ports:
                sock = stack.enter_context(socket.socket(socket.AF_INET, kind))
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                held.append((port, kind))
        yield held
