"""Where a listener's socket binds, in one place for the listener and for the worker supervisor.

The supervisor of `--udp-thread-num` workers binds every listener's sockets itself (see
`stunnerd.workers.sockets`) and the workers look them up by the same key, so both sides must
agree on the address and the kind of socket a listener config means.
"""

from __future__ import annotations

from typing import NamedTuple


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


def socket_kind(protocol: str) -> str:
    return "tcp" if protocol in ("TURN-TCP", "TURN-TLS") else "udp"
