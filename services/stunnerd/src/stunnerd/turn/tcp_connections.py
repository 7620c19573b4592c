"""The peer connections of TCP allocations (RFC 6062), as plain state: no I/O, no clock.

A TCP allocation's relayed address is a listening TCP socket. Each peer connection on it, made
by a Connect (§5.2) or accepted from a peer (§5.3), gets a CONNECTION-ID and goes through three
states: CONNECTING (outgoing only, at most `CONNECT_TIMEOUT_S`), WAITING_BIND (until the
client's ConnectionBind on a new data connection, at most `BIND_TIMEOUT_S`), BOUND (the edge
relays raw bytes between the two connections). The table indexes connections by id and by
allocation, so deleting an allocation closes its connections and a second Connect to the same
peer is recognised (446). Ids are a per-listener counter: a ConnectionBind must still come with
the allocation owner's credentials, so an id is not a secret.
"""

from __future__ import annotations

import enum
from typing import Any

from stunnerd.turn import codec
from stunnerd.turn.effects import Address, ClosePeerConnection, Effect
from stunnerd.turn.errors import BadRequestError, UnsupportedTransportError

CONNECT_TIMEOUT_S = 30.0  # RFC 6062 §5.2: "at least 30 seconds"
BIND_TIMEOUT_S = 30.0  # RFC 6062 §5.4
MAX_CONNECTIONS_PER_ALLOCATION = 64  # peer connections (any state) one TCP allocation may hold
CONNECTION_ID_MAX = 0xFFFFFFFF


class ConnectionState(enum.Enum):
    CONNECTING = "connecting"
    WAITING_BIND = "waiting-bind"
    BOUND = "bound"


class PeerConnection:
    """One peer connection of a TCP allocation."""

    __slots__ = (
        "client",
        "connection_id",
        "deadline",
        "key",
        "peer",
        "state",
        "transaction_id",
    )

    def __init__(
        self,
        connection_id: int,
        client: Address,
        peer: Address,
        state: ConnectionState,
        deadline: float,
        transaction_id: bytes = b"",
        key: bytes = b"",
    ) -> None:
        self.connection_id = connection_id
        self.client = client  # the control connection, i.e. the allocation's key
        self.peer = peer
        self.state = state
        self.deadline = deadline
        self.transaction_id = transaction_id  # of the Connect waiting for its answer
        self.key = key  # to sign that answer


class PeerConnections:
    """Every peer connection of one listener's TCP allocations."""

    __slots__ = ("_by_allocation", "_next_id", "by_id")

    def __init__(self) -> None:
        self.by_id: dict[int, PeerConnection] = {}
        self._by_allocation: dict[Address, dict[int, PeerConnection]] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.by_id)

    def of(self, client: Address) -> dict[int, PeerConnection]:
        return self._by_allocation.get(client, {})

    def count(self, client: Address) -> int:
        return len(self._by_allocation.get(client, ()))

    def to_peer(self, client: Address, peer: Address) -> PeerConnection | None:
        """A connection of this allocation to this peer transport address, in any state."""
        for conn in self._by_allocation.get(client, {}).values():
            if conn.peer == peer:
                return conn
        return None

    def add(
        self,
        client: Address,
        peer: Address,
        state: ConnectionState,
        deadline: float,
        transaction_id: bytes = b"",
        key: bytes = b"",
    ) -> PeerConnection:
        connection_id = self._new_id()
        conn = PeerConnection(connection_id, client, peer, state, deadline, transaction_id, key)
        self.by_id[connection_id] = conn
        self._by_allocation.setdefault(client, {})[connection_id] = conn
        return conn

    def remove(self, connection_id: int) -> PeerConnection | None:
        conn = self.by_id.pop(connection_id, None)
        if conn is not None:
            mine = self._by_allocation.get(conn.client)
            if mine is not None:
                mine.pop(connection_id, None)
                if not mine:
                    del self._by_allocation[conn.client]
        return conn

    def drop_allocation(self, client: Address, out: list[Effect]) -> None:
        """The allocation is gone: every connection it holds is closed."""
        for connection_id in list(self._by_allocation.pop(client, {})):
            self.by_id.pop(connection_id, None)
            out.append(ClosePeerConnection(connection_id))

    def clear(self) -> None:
        self.by_id.clear()
        self._by_allocation.clear()

    def _new_id(self) -> int:
        while True:
            self._next_id = self._next_id % CONNECTION_ID_MAX + 1
            if self._next_id not in self.by_id:
                return self._next_id


def check_transport(
    transport: int, attrs: dict[str, Any], *, stream: bool, tcp_relays: bool
) -> bool:
    """Whether an Allocate's REQUESTED-TRANSPORT asks for a TCP relay; a `TurnError` if it
    cannot be served.

    UDP relays everywhere; TCP relays (RFC 6062 §5.1) only on a stream control connection and
    only where this process may serve them, and never with EVEN-PORT or RESERVATION-TOKEN.
    """
    protocol = transport & 0xFF000000
    if protocol == codec.TRANSPORT_UDP:
        return False
    if protocol != codec.TRANSPORT_TCP:
        raise UnsupportedTransportError()
    if not stream:
        raise UnsupportedTransportError(
            "Unsupported Transport Protocol (TCP relays need a TCP or TLS listener)"
        )
    if not tcp_relays:
        raise UnsupportedTransportError(
            "Unsupported Transport Protocol (TCP relays need a single worker process)"
        )
    if "EVEN-PORT" in attrs or "RESERVATION-TOKEN" in attrs:
        raise BadRequestError("Bad Request (EVEN-PORT or RESERVATION-TOKEN with a TCP relay)")
    return True
