"""Free loopback ports for servers that cannot bind port 0 themselves (external binaries)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

LOOPBACK = "127.0.0.1"

# Ports handed out for servers come from below the kernel's ephemeral range (Linux's default is
# 32768-60999), so that no socket bound to port 0 and no outgoing connection of a test running
# beside this one can take a port between the moment it is picked and the moment the server binds
# it. Each pytest-xdist worker draws from a slice of its own, so two workers never pick the same
# number either. 20000 leaves the services' default ports (3478-16379) alone, 30000 Kubernetes'
# NodePort range (30000-32767) to the node tier's kube-proxy.
HANDED_OUT = range(20000, 30000)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    top = min(HANDED_OUT.stop, _ephemeral_low())
    size = (top - HANDED_OUT.start) // max(count, 1)
    first = HANDED_OUT.start + (index % max(count, 1)) * size
    return range(first, first + size)


class _Pool:
    """Walks this worker's slice from a random start, so that two test runs side by side (or one
    after another, while the first one's sockets linger in TIME_WAIT) seldom meet."""

    def __init__(self) -> None:
        self.slice = _worker_slice()
        self.cursor = random.randrange(len(self.slice)) if self.slice else 0

    def block(self, count: int) -> int | None:
        """The first of `count` consecutive numbers not handed out before; None: use port 0."""
        if len(self.slice) < max(64, count * 4):  # an ephemeral range that starts low
            return None
        if self.cursor + count > len(self.slice):
            self.cursor = 0
        first = self.slice[self.cursor]
        self.cursor += count
        return first


_pool = _Pool()


def _bindable(host: str, first: int | None, count: int, *kinds: int) -> int | None:
    """`first` (or the kernel's pick) if `count` ports from it bind on `host` for every kind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        for offset in range(count):
            for kind in kinds:
                sock = stack.enter_context(socket.socket(family, kind))
                try:
                    sock.bind((host, 0 if first is None else first + offset))
                except OSError:
                    return None
                if first is None:
                    first = int(sock.getsockname()[1])
        return first


def free_ports(count: int, *kinds: int, host: str = LOOPBACK) -> int:
    """The first of `count` consecutive ports free on `host` for each of `kinds` a moment ago.

    No later call hands out any of them (until the pool wraps around, thousands of ports later).
    """
    kinds = kinds or (socket.SOCK_STREAM,)
    for _ in range(2000):
        first = _pool.block(count)
        if first is None and count > 1:
            first = free_port(kinds[0], host)
        if (port := _bindable(host, first, count, *kinds)) is not None:
            return port
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def free_port(kind: int = socket.SOCK_STREAM, host: str = LOOPBACK) -> int:
    """Return a port that was free on `host` for `kind` a moment ago.

    Prefer binding port 0 in the code under test; this is for programs such as redis-server or
    coturn that need a number on their command line.
    """
    return free_ports(1, kind, host=host)


def free_udp_tcp_port(host: str = LOOPBACK) -> int:
    """Return a port number free for both UDP and TCP on `host` (TURN servers bind both)."""
    return free_ports(1, socket.SOCK_DGRAM, socket.SOCK_STREAM, host=host)


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
