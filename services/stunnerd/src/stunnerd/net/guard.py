"""What a client that never authenticates may hold at the edge: connections, time and bandwidth.

TCP, TLS and DTLS clients hold a file descriptor (or a DTLS session) from their first packet, so
connections that idle or trickle could exhaust the server without ever sending a credential.
`ConnectionLimits` bounds them, checked by the stream and DTLS listeners:

* at most `max_per_source` connections (DTLS sessions) per source IP and listener; more are
  closed at once (TLS: after the handshake, which `handshake_timeout_s` bounds);
* a TLS or DTLS handshake must finish within `handshake_timeout_s`;
* the first complete message must arrive within `first_message_timeout_s`;
* until the connection holds an allocation, it must keep sending at least
  `preauth_min_bytes_per_s` on average over each `preauth_window_s`: a slow trickle is closed.

Once a connection holds an allocation these no longer apply (media may pause; the allocation's
lifetime governs). `ClientLimits` bundles them with the engine's `RequestLimits`. The bounds
annotated on each limit are what the settings accept (`STUNNERD_MAX_CONNECTIONS_PER_SOURCE`, ...).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Annotated

from stunnerd.bounds import Ge, Gt
from stunnerd.turn.guard import RequestLimits


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_per_source: Annotated[int, Ge(0)] = 64
    """TCP/TLS connections and DTLS sessions per source IP and listener (0: unlimited)."""
    handshake_timeout_s: Annotated[float, Gt(0)] = 10.0
    """A TLS or DTLS handshake must finish within this."""
    first_message_timeout_s: Annotated[float, Gt(0)] = 10.0
    """A new TCP/TLS/DTLS client must send a complete message within this."""
    preauth_min_bytes_per_s: Annotated[float, Ge(0)] = 8.0
    """Until it holds an allocation, a connection sending less than this on average is closed."""
    preauth_window_s: Annotated[float, Gt(0)] = 10.0


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Everything that bounds unauthenticated clients, from the settings to every listener."""

    request: RequestLimits = field(default_factory=RequestLimits)
    connection: ConnectionLimits = field(default_factory=ConnectionLimits)

    def to_json(self) -> str:
        """For worker processes, which get their settings on the command line."""
        return json.dumps({"request": asdict(self.request), "connection": asdict(self.connection)})

    @classmethod
    def from_json(cls, text: str) -> ClientLimits:
        data = json.loads(text)
        return cls(RequestLimits(**data["request"]), ConnectionLimits(**data["connection"]))


class SourceCounter:
    """Open connections per source IP; entries go when their count drops to zero."""

    __slots__ = ("counts", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: dict[str, int] = {}

    def acquire(self, ip: str) -> bool:
        held = self.counts.get(ip, 0)
        if self.limit > 0 and held >= self.limit:
            return False
        self.counts[ip] = held + 1
        return True

    def release(self, ip: str) -> None:
        held = self.counts.get(ip, 0) - 1
        if held > 0:
            self.counts[ip] = held
        else:
            self.counts.pop(ip, None)
