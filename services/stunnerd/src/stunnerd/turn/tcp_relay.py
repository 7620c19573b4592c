"""TURN-TCP relays (RFC 6062): Connect, ConnectionBind, ConnectionAttempt, as engine decisions.

A client on a TCP or TLS listener allocates with REQUESTED-TRANSPORT TCP (the transport check is
`tcp_connections.transport_refusal`); its relayed address is a listening TCP socket the edge
opens like a UDP relay. Then:

* Connect (§5.2) on the control connection: the peer must be admitted by the routes (as for
  ChannelBind: IP and port, 403 otherwise), must not already have a connection of this
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

from stunnerd.turn import codec
from stunnerd.turn.allocation import family_of
from stunnerd.turn.auth import AuthenticatedRequest
from stunnerd.turn.codec import Class, TcpMethod
from stunnerd.turn.effects import (
    Address,
    BindPeerConnection,
    ClosePeerConnection,
    ConnectPeer,
    Effect,
    SendToClient,
)
from stunnerd.turn.methods import TurnMethods
from stunnerd.turn.tcp_connections import (
    BIND_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    ConnectionState,
    PeerConnection,
)
from stunnerd.turn.timers import DeadlineKind


class TcpRelayMethods(TurnMethods):
    """The RFC 6062 handlers and edge reports; state set up by `TurnEngine.__init__`."""

    max_tcp_connections: int
    _indications: int

    # ------------------------------------------------------------------ requests

    def _connect(self, req: AuthenticatedRequest, now: float, out: list[Effect]) -> None:
        """RFC 6062 §5.2."""
        alloc = self._owned_allocation(req, now, out)
        if alloc is None:
            return
        if not alloc.tcp:
            self._fail(req, 400, "Bad Request (Connect on a UDP allocation)", now, out)
            return
        if len(req.peers) != 1:
            self._fail(req, 400, "Bad Request (one XOR-PEER-ADDRESS expected)", now, out)
            return
        peer = req.peers[0]
        if family_of(peer[0]) != alloc.family:
            self._fail(req, 443, "Peer Address Family Mismatch", now, out)
            return
        existing = self._tcp.to_peer(alloc.client, peer)
        if existing is not None:
            if existing.transaction_id == req.message.transaction_id:
                return  # the same Connect again while it is under way: its answer will come
            self._fail(req, 446, "Connection Already Exists", now, out)
            return
        if not self.policies.peers.admits(peer[0], peer[1]):
            self._fail(req, 403, "Forbidden (peer not admitted by any route)", now, out)
            return
        if self._tcp.count(alloc.client) >= self.max_tcp_connections:
            self._fail(req, 508, "Insufficient Capacity (too many peer connections)", now, out)
            return
        self._install_permission(alloc, peer[0], now)
        conn = self._tcp.add(
            alloc.client,
            peer,
            ConnectionState.CONNECTING,
            now + CONNECT_TIMEOUT_S,
            req.message.transaction_id,
            req.key,
        )
        self._deadlines.schedule(
            conn.deadline, DeadlineKind.TCP_CONNECTION, alloc.client, conn.connection_id
        )
        out.append(ConnectPeer(alloc.client, conn.connection_id, peer))

    def _connection_bind(self, req: AuthenticatedRequest, now: float, out: list[Effect]) -> None:
        """RFC 6062 §5.4: on a new connection, signed by the user of the allocation."""
        if not self.stream:
            reason = "Bad Request (ConnectionBind needs a TCP or TLS connection)"
            self._fail(req, 400, reason, now, out)
            return
        if req.client in self.allocations or req.client in self._pending:
            self._fail(req, 400, "Bad Request (ConnectionBind on a control connection)", now, out)
            return
        connection_id = req.message.attributes.get("CONNECTION-ID")
        conn = self._tcp.by_id.get(connection_id) if connection_id is not None else None
        if conn is None or conn.state is not ConnectionState.WAITING_BIND or conn.deadline <= now:
            self._fail(req, 400, "Bad Request (unknown or expired CONNECTION-ID)", now, out)
            return
        alloc = self.allocations.get(conn.client)
        if alloc is None or alloc.user_id != req.user_id:
            self._fail(req, 441, "Wrong Credentials", now, out)
            return
        conn.state = ConnectionState.BOUND
        self._succeed(req, {}, now, out)
        out.append(BindPeerConnection(req.client, conn.connection_id))

    # ------------------------------------------------------------------ edge reports

    def peer_connected(self, connection_id: int, now: float) -> list[Effect]:
        """The edge's outgoing connection succeeded: answer the Connect, await the bind."""
        out: list[Effect] = []
        conn = self._tcp.by_id.get(connection_id)
        if conn is None or conn.state is not ConnectionState.CONNECTING:
            out.append(ClosePeerConnection(connection_id))
            return out
        alloc = self.allocations.get(conn.client)
        if alloc is None:
            self._tcp.remove(connection_id)
            out.append(ClosePeerConnection(connection_id))
            return out
        conn.state = ConnectionState.WAITING_BIND
        conn.deadline = now + BIND_TIMEOUT_S
        self._deadlines.schedule(
            conn.deadline, DeadlineKind.TCP_CONNECTION, conn.client, connection_id
        )
        self._answer_connect(conn, {"CONNECTION-ID": connection_id}, now, out)
        return out

    def peer_connect_failed(self, connection_id: int, now: float) -> list[Effect]:
        """The edge could not connect to the peer: 447 (RFC 6062 §5.2)."""
        out: list[Effect] = []
        conn = self._tcp.by_id.get(connection_id)
        if conn is not None and conn.state is ConnectionState.CONNECTING:
            self._tcp.remove(connection_id)
            self._connect_failed(conn, now, out)
        return out

    def peer_arrived(self, client: Address, peer: Address, now: float) -> tuple[int, list[Effect]]:
        """A peer connected to `client`'s relayed address (RFC 6062 §5.3).

        Returns the new connection id (0: refused, close it) and the ConnectionAttempt.
        """
        out: list[Effect] = []
        alloc = self.allocations.get(client)
        if alloc is None or not alloc.tcp or alloc.expires <= now:
            return 0, out
        expires = alloc.permissions.get(peer[0])
        if expires is None or expires <= now or not self.policies.peers.admits(peer[0], peer[1]):
            return 0, out
        if self._tcp.count(client) >= self.max_tcp_connections:
            return 0, out
        conn = self._tcp.add(client, peer, ConnectionState.WAITING_BIND, now + BIND_TIMEOUT_S)
        self._deadlines.schedule(
            conn.deadline, DeadlineKind.TCP_CONNECTION, client, conn.connection_id
        )
        attempt = codec.encode(
            TcpMethod.CONNECTION_ATTEMPT,
            Class.INDICATION,
            self._next_indication_id(),
            {"XOR-PEER-ADDRESS": peer, "CONNECTION-ID": conn.connection_id},
            software=self.software,
        )
        out.append(SendToClient(client, attempt))
        return conn.connection_id, out

    def peer_connection_closed(self, connection_id: int, now: float) -> list[Effect]:
        """The edge saw a peer connection (or its data connection) end: forget it."""
        out: list[Effect] = []
        conn = self._tcp.remove(connection_id)
        if conn is not None and conn.state is ConnectionState.CONNECTING:
            self._connect_failed(conn, now, out)
        return out

    @property
    def tcp_connection_count(self) -> int:
        return len(self._tcp)

    # ------------------------------------------------------------------ helpers

    def _next_indication_id(self) -> bytes:
        """Indications need a transaction id; uniqueness is all that matters (RFC 8489 §6)."""
        self._indications += 1
        return self._indications.to_bytes(12, "big")

    def _tcp_deadline(self, connection_id: int, now: float, out: list[Effect]) -> None:
        """A connect (§5.2) or bind (§5.4) timeout: close whatever has not moved on."""
        conn = self._tcp.by_id.get(connection_id)
        if conn is None or conn.state is ConnectionState.BOUND or conn.deadline > now:
            return
        self._tcp.remove(connection_id)
        out.append(ClosePeerConnection(connection_id))
        if conn.state is ConnectionState.CONNECTING:
            self._connect_failed(conn, now, out)

    def _sync_tcp_connections(self, client: Address, out: list[Effect]) -> None:
        """After a route change: close the connections to peers no route admits any more."""
        peers = self.policies.peers
        for conn in list(self._tcp.of(client).values()):
            if not peers.admits(conn.peer[0], conn.peer[1]):
                self._tcp.remove(conn.connection_id)
                out.append(ClosePeerConnection(conn.connection_id))

    def _connect_failed(self, conn: PeerConnection, now: float, out: list[Effect]) -> None:
        answer = codec.error_response(
            TcpMethod.CONNECT,
            conn.transaction_id,
            447,
            "Connection Timeout or Failure",
            key=conn.key,
            software=self.software,
        )
        self._cache.remember(conn.client, conn.transaction_id, answer, now)
        out.append(SendToClient(conn.client, answer))

    def _answer_connect(
        self, conn: PeerConnection, attrs: dict[str, int], now: float, out: list[Effect]
    ) -> None:
        answer = codec.encode(
            TcpMethod.CONNECT,
            Class.RESPONSE,
            conn.transaction_id,
            attrs,
            key=conn.key,
            software=self.software,
        )
        self._cache.remember(conn.client, conn.transaction_id, answer, now)
        out.append(SendToClient(conn.client, answer))
