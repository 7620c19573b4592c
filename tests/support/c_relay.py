"""The C relay (`stunnerd._fastpath.FastRelay`) driven directly, with real sockets on the
loopback addresses and ports chosen by the kernel: what its unit tests share."""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def fast_relay() -> Iterator[Any]:
    from stunnerd import _fastpath

    relay = _fastpath.FastRelay()
    try:
        yield relay
    finally:
        relay.close()


def udp_socket(host: str) -> socket.socket:
    """A UDP socket bound to `host` on a free port, reads timing out after 2 s."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.settimeout(2)
    return sock


def watched_listener(relay: Any, host: str, max_stun: int) -> socket.socket:
    """A non-blocking listener socket on `host` that `relay` reads, with its STUN size limit."""
    from stunnerd import _fastpath

    sock = udp_socket(host)
    sock.setblocking(False)
    relay.watch(sock.fileno(), _fastpath.LISTENER, 0, max_stun)
    return sock


def poll(relay: Any) -> list[tuple[int, bytes, Any]]:
    """What `relay` hands to Python once it is readable (2 s at most): (fd, data, address)."""
    select.select([relay.fileno()], [], [], 2)
    misses: list[tuple[int, bytes, Any]] = relay.poll()
    return misses
