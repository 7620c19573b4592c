"""TURN-TCP relays (RFC 6062): Connect, ConnectionBind, ConnectionAttempt, as engine decisions.

A client on a TCP or TLS listener allocates with REQUESTED-TRANSPORT TCP (the transport check is
`tcp_connections.check_transport`); its relayed address is a listening TCP socket the edge
opens like a UDP relay. Then:

* Connect (§5.2) on the control connection: the peer is read and its family checked as in
  CreatePermission and ChannelBind (`allocation.peer_of`: an IPv4-mapped peer is IPv4, 443 for
  a family the allocation lacks), must be admitted by the routes (as for ChannelBind: IP and
  port, 403 otherwise), must not already have a connection of this
  allocation (446); a permission for its IP is installed and the edge is asked to connect
  (`ConnectPeer`). The answer waits for the edge: `peer_connected` answers with CONNECTION-ID,
  `peer_connect_failed` or `CONNECT_TIMEOUT_S` with 447.
* A peer connecting to the relayed address (§5.3) is offered to `peer_arrived`: it is accepted
  only with a permission for its IP and an admitting route; the client gets a
  ConnectionAttempt indication on its control connection.
* ConnectionBind (§5.4) arrives on a new connection to the same listener, signed by the
  allocation's user: the connection id must be waiting for its bind (400 otherwise); after the
  success answer the edge splices the two connections (`BindPeerConnection`). An unbound peer
  connection is closed after `BIND_TIMEOUT_S`.

Deleting the allocation (Refresh 0, expiry, its control connection closing, the listener
closing) closes its peer connections, and so does a route change that no longer admits a peer.
"""

from __future__ import annotations

from stunnerd.turn.allocation import peer_of
from stunnerd.turn.answers import Answerer
from stunnerd.turn.auth import AuthenticatedRequest
from stunnerd.turn.codec import TcpMethod
from stunnerd.turn.effects import (
    Address,
    BindPeerConnection,
    ClosePeerConnection,
    ConnectPeer,
    Effect,
)
from stunnerd.turn.errors import (
    BadRequestError,
    ConnectionAlreadyExistsError,
    ConnectionFailureError,
    ForbiddenError,
    InsufficientCapacityError,
    WrongCredentialsError,
)
from stunnerd.turn.policies import PeerPolicy, Policies
from stunnerd.turn.refusals import RefusalLog
from stunnerd.turn.table import AllocationTable
from stunnerd.turn.tcp_connections import (
    BIND_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    ConnectionState,
    PeerConnection,
)
from stunnerd.turn.timers import DeadlineKind


class TcpRelayHandlers:
    """The RFC 6062 requests and edge reports over one listener's allocations and connections."""

    __slots__ = ("answers", "connections", "max_connections", "refusals", "stream", "table")

    def __init__(
        self,
        table: AllocationTable,
        answers: Answerer,
        *,
        stream: bool,
        max_connections: int,
        refusals: RefusalLog | None = None,
    ) -> None:
        self.table = table
        self.connections = table.connections
        self.answers = answers
        self.stream = stream
        self.max_connections = max_connections  # peer connections per TCP allocation
        self.refusals = refusals if refusals is not None else RefusalLog()

    # ------------------------------------------------------------------ requests

    def connect(
        self, req: AuthenticatedRequest, policies: Policies, now: float, out: list[Effect]
    ) -> None:
        """RFC 6062 §5.2."""
        alloc = self.table.owned(req, now, out)
        if not alloc.tcp:
            raise BadRequestError("Bad Request (Connect on a UDP allocation)")
        if len(req.peers) != 1:
            raise BadRequestError("Bad Request (one XOR-PEER-ADDRESS expected)")
        peer = peer_of(alloc, req.peers[0])
        existing = self.connections.to_peer(alloc.client, peer)
        if existing is not None:
            if existing.transaction_id == req.message.transaction_id:
                return  # the same Connect again while it is under way: its answer will come
            raise ConnectionAlreadyExistsError()
        if not policies.peers.admits(peer[0], peer[1]):
            raise ForbiddenError()
        if self.connections.count(alloc.client) >= self.max_connections:
            raise InsufficientCapacityError(
                "Insufficient Capacity (too many peer connections)",
                limit="tcp_connections_per_allocation",
            )
        self.table.install_permission(alloc, peer[0], now)
        conn = self.connections.add(
            alloc.client,
            peer,
            ConnectionState.CONNECTING,
            now + CONNECT_TIMEOUT_S,
            req.message.transaction_id,
            req.key,
        )
        self._schedule(conn)
        out.append(ConnectPeer(alloc.client, conn.connection_id, peer))

    def connection_bind(
        self, req: AuthenticatedRequest, policies: Policies, now: float, out: list[Effect]
    ) -> None:
        """RFC 6062 §5.4: on a new connection, signed by the user of the allocation."""
        if not self.stream:
            raise BadRequestError("Bad Request (ConnectionBind needs a TCP or TLS connection)")
        if self.table.state_of(req.client) is not None:
            raise BadRequestError("Bad Request (ConnectionBind on a control connection)")
        connection_id = req.message.attributes.get("CONNECTION-ID")
        conn = self.connections.by_id.get(connection_id) if connection_id is not None else None
        if conn is None or conn.state is not ConnectionState.WAITING_BIND or conn.deadline <= now:
            raise BadRequestError("Bad Request (unknown or expired CONNECTION-ID)")
        alloc = self.table.active.get(conn.client)
        if alloc is None or alloc.user_id != req.user_id:
            raise WrongCredentialsError()
        conn.state = ConnectionState.BOUND
        msg = req.message
        self.answers.success(
            out, req.client, msg.message_method, msg.transaction_id, {}, key=req.key, now=now
        )
        out.append(BindPeerConnection(req.client, conn.connection_id))

    # ------------------------------------------------------------------ edge reports

    def peer_connected(self, connection_id: int, now: float) -> list[Effect]:
        """The edge's outgoing connection succeeded: answer the Connect, await the bind."""
        out: list[Effect] = []
        conn = self.connections.by_id.get(connection_id)
        if conn is None or conn.state is not ConnectionState.CONNECTING:
            out.append(ClosePeerConnection(connection_id))
            return out
        if conn.client not in self.table.active:
            self.connections.remove(connection_id)
            out.append(ClosePeerConnection(connection_id))
            return out
        conn.state = ConnectionState.WAITING_BIND
        conn.deadline = now + BIND_TIMEOUT_S
        self._schedule(conn)
        self.answers.success(
            out,
            conn.client,
            TcpMethod.CONNECT,
            conn.transaction_id,
            {"CONNECTION-ID": connection_id},
            key=conn.key,
            now=now,
        )
        return out

    def peer_connect_failed(self, connection_id: int, now: float) -> list[Effect]:
        """The edge could not connect to the peer: 447 (RFC 6062 §5.2)."""
        out: list[Effect] = []
        conn = self.connections.by_id.get(connection_id)
        if conn is not None and conn.state is ConnectionState.CONNECTING:
            self.connections.remove(connection_id)
            self._connect_failed(conn, now, out)
        return out

    def peer_arrived(
        self, client: Address, peer: Address, peers: PeerPolicy, now: float
    ) -> tuple[int, list[Effect]]:
        """A peer connected to `client`'s relayed address (RFC 6062 §5.3).

        Returns the new connection id (0: refused, close it) and the ConnectionAttempt.
        """
        out: list[Effect] = []
        alloc = self.table.active.get(client)
        if alloc is None or not alloc.tcp or alloc.expires <= now:
            return 0, out
        expires = alloc.permissions.get(peer[0])
        if expires is None or expires <= now or not peers.admits(peer[0], peer[1]):
            return 0, out
        if self.connections.count(client) >= self.max_connections:
            self.refusals.limited("tcp_connections_per_allocation")
            return 0, out
        conn = self.connections.add(
            client, peer, ConnectionState.WAITING_BIND, now + BIND_TIMEOUT_S
        )
        self._schedule(conn)
        self.answers.indication(
            out,
            client,
            TcpMethod.CONNECTION_ATTEMPT,
            {"XOR-PEER-ADDRESS": peer, "CONNECTION-ID": conn.connection_id},
        )
        return conn.connection_id, out

    def peer_connection_closed(self, connection_id: int, now: float) -> list[Effect]:
        """The edge saw a peer connection (or its data connection) end: forget it."""
        out: list[Effect] = []
        conn = self.connections.remove(connection_id)
        if conn is not None and conn.state is ConnectionState.CONNECTING:
            self._connect_failed(conn, now, out)
        return out

    # ------------------------------------------------------------------ the clock, the routes

    def expire(self, connection_id: int, now: float, out: list[Effect]) -> None:
        """A connect (§5.2) or bind (§5.4) timeout: close whatever has not moved on."""
        conn = self.connections.by_id.get(connection_id)
        if conn is None or conn.state is ConnectionState.BOUND or conn.deadline > now:
            return
        self.connections.remove(connection_id)
        out.append(ClosePeerConnection(connection_id))
        if conn.state is ConnectionState.CONNECTING:
            self._connect_failed(conn, now, out)

    def sync(self, client: Address, peers: PeerPolicy, out: list[Effect]) -> None:
        """After a route change: close the connections to peers no route admits any more."""
        for conn in list(self.connections.of(client).values()):
            if not peers.admits(conn.peer[0], conn.peer[1]):
                self.connections.remove(conn.connection_id)
                out.append(ClosePeerConnection(conn.connection_id))

    def _schedule(self, conn: PeerConnection) -> None:
        self.table.deadlines.schedule(
            conn.deadline, DeadlineKind.TCP_CONNECTION, conn.client, conn.connection_id
        )

    def _connect_failed(self, conn: PeerConnection, now: float, out: list[Effect]) -> None:
        self.answers.error(
            out,
            conn.client,
            TcpMethod.CONNECT,
            conn.transaction_id,
            ConnectionFailureError(),
            key=conn.key,
            now=now,
        )
