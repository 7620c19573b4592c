"""How a `TurnServer` runs its sockets and timers: the network settings that are not client limits.

`StunnerdSettings` (the `STUNNERD_*` variables) builds one `ServerTuning`; the process's own server
takes it directly and worker processes get it on their command line as JSON, so a worker runs with
the same timeouts and switches as the supervisor would. What bounds unauthenticated clients lives
beside it in `stunnerd.net.guard.ClientLimits`. Each field is the setting of the same name
(`STUNNERD_UDP_GSO`, `STUNNERD_DNS_REFRESH_S`, ...); its annotated bounds are what is accepted.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

from stunnerd.bounds import Ge, Gt
from stunnerd.turn.tcp_connections import MAX_CONNECTIONS_PER_ALLOCATION


@dataclasses.dataclass(frozen=True, slots=True)
class ServerTuning:
    udp_gso: bool = True
    """Batch datagrams to one destination into one `sendmsg` with UDP_SEGMENT, where supported."""
    fastpath: bool = True
    """Relay established TURN-UDP channels in C (`stunnerd.fastpath`), where it is built."""
    dns_refresh_s: Annotated[float, Gt(0)] = 5.0
    """How often STRICT_DNS cluster names are resolved again."""
    dns_timeout_s: Annotated[float, Gt(0)] = 5.0
    """How long one resolution may take before the previous answer is kept."""
    client_idle_timeout_s: Annotated[float, Gt(0)] = 60.0
    """A TCP/TLS connection or DTLS session without an allocation, silent this long, is closed."""
    socket_close_timeout_s: Annotated[float, Gt(0)] = 1.0
    """How long closing a UDP/DTLS listener waits for the kernel to release its port."""
    stream_close_timeout_s: Annotated[float, Gt(0)] = 5.0
    """How long closing a TCP/TLS listener waits for its server socket to close."""
    max_tcp_connections_per_allocation: Annotated[int, Ge(1)] = MAX_CONNECTIONS_PER_ALLOCATION
    """Peer connections one TCP allocation (RFC 6062) may hold, in any state; past it Connect
    gets 508."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ServerTuning:
        return cls(**json.loads(text))
