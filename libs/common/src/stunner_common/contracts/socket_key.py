"""The key of a listener's socket: what stunnerd's supervisor binds and its workers look up.

With ``--udp-thread-num`` workers the supervisor binds every listener's sockets itself and sends
them to the workers, each with its key; a worker's listener finds its socket by the key it
derives from its own config. Both sides derive it here, from the listener's protocol, address
and port, the process's bind host and the node address: a listener binds on the bind host, or on
``::`` when what it advertises (`listener_address.family_address`: the node's address for the
node-address placeholder) is IPv6 and the bind host is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from stunner_common.contracts.listener_address import family_address

STREAM_PROTOCOLS: Final = frozenset({"TURN-TCP", "TURN-TLS"})
IPV6_WILDCARD: Final = "::"


class SocketKey(NamedTuple):
    """What a listener binds: `kind` is `udp` (TURN-UDP, TURN-DTLS) or `tcp` (TURN-TCP/TLS)."""

    kind: str
    host: str
    port: int

    def encode(self) -> dict[str, Any]:
        """The key's fields in a supervisor ↔ worker message."""
        return {"kind": self.kind, "host": self.host, "port": self.port}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> SocketKey:
        return cls(str(fields["kind"]), str(fields["host"]), int(fields["port"]))


def socket_kind(protocol: str) -> str:
    return "tcp" if protocol in STREAM_PROTOCOLS else "udp"


def listener_bind_host(bind_host: str, address: str) -> str:
    """Where a listener binds: `bind_host`, or `::` for an IPv6 listener on an IPv4 host."""
    if ":" in address and ":" not in bind_host:
        return IPV6_WILDCARD
    return bind_host


def listener_socket_key(
    protocol: str, address: str, port: int, bind_host: str, node_address: str = ""
) -> SocketKey:
    """The key of a listener's socket (see the module docstring)."""
    host = listener_bind_host(bind_host, family_address(address, node_address))
    return SocketKey(socket_kind(protocol), host, port)
