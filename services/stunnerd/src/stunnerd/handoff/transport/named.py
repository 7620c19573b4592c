"""A listening socket handed over in a hot handoff, apart from the channel that carries it, so
that the admin servers can name one without loading the handoff machinery."""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NamedSocket:
    """A listening socket handed over beside the state (the health or metrics server's): its
    role, the host it was asked to bind and the port it is bound to."""

    name: str
    host: str
    port: int
    sock: socket.socket
