"""How a `TurnServer` runs its sockets and timers: the network settings that are not client limits.

`StunnerdSettings` (the `STUNNERD_*` variables) builds one `ServerTuning`; the process's own server
takes it directly and worker processes get it on their command line as JSON, so a worker runs with
the same timeouts and switches as the supervisor would. What bounds unauthenticated clients lives
beside it in `stunnerd.net.guard.ClientLimits`.
"""

from __future__ import annotations

import dataclasses
import json

from stunnerd.turn.tcp_connections import MAX_CONNECTIONS_PER_ALLOCATION

DNS_REFRESH_S = 5.0
DNS_TIMEOUT_S = 5.0
CLIENT_IDLE_TIMEOUT_S = 60.0
SOCKET_CLOSE_TIMEOUT_S = 1.0
STREAM_CLOSE_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class ServerTuning:
    udp_gso: bool = True
    """Batch datagrams to one destination into one `sendmsg` with UDP_SEGMENT, where supported."""
    fastpath: bool = True
    """Relay established TURN-UDP channels in C (`stunnerd.fastpath`), where it is built."""
    dns_refresh_s: float = DNS_REFRESH_S
    """How often STRICT_DNS cluster names are resolved again."""
    dns_timeout_s: float = DNS_TIMEOUT_S
    """How long one resolution may take before the previous answer is kept."""
    client_idle_timeout_s: float = CLIENT_IDLE_TIMEOUT_S
    """A TCP/TLS connection or DTLS session without an allocation, silent this long, is closed."""
    socket_close_timeout_s: float = SOCKET_CLOSE_TIMEOUT_S
    """How long closing a UDP/DTLS listener waits for the kernel to release its port."""
    stream_close_timeout_s: float = STREAM_CLOSE_TIMEOUT_S
    """How long closing a TCP/TLS listener waits for its server socket to close."""
    max_tcp_connections_per_allocation: int = MAX_CONNECTIONS_PER_ALLOCATION
    """Peer connections one TCP allocation (RFC 6062) may hold, in any state."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ServerTuning:
        return cls(**json.loads(text))
