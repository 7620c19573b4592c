"""Relay sockets: one UDP socket per allocation, and the peer → client half of the fast path.

A relay protocol receives the peers' datagrams of one allocation. A datagram from a peer with a
channel route is wrapped in a ChannelData header and sent to the client right here (one dict
lookup keyed by the peer address; a few integer additions for the counters); anything else goes
to the listener's engine through `RelayOwner.peer_slow_path`. The client side differs by
transport: UDP clients are reached through the shared `SendBatcher`, stream clients get the frame
padded to 4 bytes (RFC 8656 §12.5), DTLS clients go through their session.

Binding follows RFC 8656 §7.2 and §14.6: a relay port may have to be even, and with the R bit of
EVEN-PORT the next port up is bound too and held for a later Allocate.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any, Protocol

from stunnerd.net.batch import SendBatcher
from stunnerd.net.ports import FastPathPort
from stunnerd.route_table.table import Address as Address
from stunnerd.route_table.table import PeerChannels
from stunnerd.route_table.table import Traffic as Traffic

log = logging.getLogger(__name__)

SendTo = Callable[[bytes, Any], None]
RX_PKTS, RX_BYTES, TX_PKTS, TX_BYTES = 0, 1, 2, 3
CHANNEL_HEADER = struct.Struct("!HH").pack
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
EVEN_PORT_ATTEMPTS = 64
_BUFFER_OPTIONS = (socket.SO_RCVBUF, socket.SO_SNDBUF)
_NONBLOCKING_DGRAM = socket.SOCK_DGRAM | socket.SOCK_NONBLOCK  # no syscall apart to set it


def tune_udp_socket(sock: socket.socket) -> None:
    for opt in _BUFFER_OPTIONS:
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:
            continue  # the kernel caps it; never fatal


def new_traffic() -> Traffic:
    return [0, 0, 0, 0]


class RelayOwner(Protocol):
    """What a relay needs from its listener."""

    batcher: SendBatcher
    traffic: Traffic

    def client_sender(self, client: Address) -> SendTo:
        """A callable(data, client) that delivers bytes to this client."""

    def peer_slow_path(self, client: Address, peer: Any, data: bytes) -> None:
        """A peer datagram without a channel route: the engine decides."""

    def client_socket(self) -> socket.socket | None:
        """The listener's own UDP socket (TURN-UDP), for batched sends to clients."""


def _send(via: Any, frame: bytes, client: Address) -> None:
    via(frame, client)


def _send_padded(via: Any, frame: bytes, client: Address) -> None:
    pad = -len(frame) % 4
    via(frame + b"\x00" * pad if pad else frame, client)


class DatagramRelayProtocol(asyncio.DatagramProtocol):
    """The relay socket of one allocation; routed peer datagrams go to the client as ChannelData.

    How a frame reaches the client is set per transport: `deliver(deliver_via, frame, client)`,
    counted in `tx_counts` where the client sender does not count its own sends.
    """

    __slots__ = (
        "client",
        "deliver",
        "deliver_via",
        "listener",
        "peer_channels",
        "sock",
        "transport",
        "tx_counts",
    )

    def __init__(self, listener: RelayOwner, client: Address, sock: socket.socket) -> None:
        self.listener = listener
        self.client = client
        self.sock = sock  # the raw socket, for batched sends to peers
        # peer address -> (channel number, traffic counters of the peer's cluster)
        self.peer_channels: PeerChannels = {}
        self.transport: asyncio.DatagramTransport | None = None
        self.deliver: Callable[[Any, bytes, Address], None] = _send
        self.deliver_via: Any = listener.client_sender(client)
        self.tx_counts: Traffic = new_traffic()  # the client sender counts these itself

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        hit = self.peer_channels.get(addr)
        if hit is None:
            self.listener.peer_slow_path(self.client, addr, data)
            return
        n = len(data)
        counts = hit[1]
        counts[0] += 1
        counts[1] += n
        counts = self.tx_counts
        counts[2] += 1
        counts[3] += n + 4
        self.deliver(self.deliver_via, CHANNEL_HEADER(hit[0], n) + data, self.client)

    def error_received(self, exc: Exception) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("relay for %s: %s", self.client, exc)


class FastRelayTransport(asyncio.BaseTransport):
    """A relay socket read by the C relay (`FastPathPort`) instead of the event loop.

    Datagrams the C relay does not route reach the relay protocol's `datagram_received` as they
    would from a transport; closing forgets the socket's routes before the socket goes.
    """

    def __init__(self, sock: socket.socket, fastpath: FastPathPort) -> None:
        super().__init__()
        self.sock = sock
        self.fastpath = fastpath

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.fastpath.unwatch(self.sock)
            self.sock.close()

    def is_closing(self) -> bool:
        return self.sock.fileno() < 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname":
            return self.sock.getsockname()
        if name == "socket":
            return self.sock
        return default


class UdpRelayProtocol(DatagramRelayProtocol):
    """Relay whose client speaks plain UDP: ChannelData to the client goes through the batcher
    on the listener's socket, counted in the listener's traffic."""

    __slots__ = ()

    def __init__(self, listener: RelayOwner, client: Address, sock: socket.socket) -> None:
        super().__init__(listener, client, sock)
        client_sock = listener.client_socket()
        assert client_sock is not None, "a UDP relay belongs to a started TURN-UDP listener"
        self.deliver, self.deliver_via = listener.batcher.send, client_sock
        self.tx_counts = listener.traffic


class StreamRelayProtocol(DatagramRelayProtocol):
    """Relay whose client speaks a stream (TCP/TLS): ChannelData is padded to 4 bytes."""

    __slots__ = ()

    def __init__(self, listener: RelayOwner, client: Address, sock: socket.socket) -> None:
        super().__init__(listener, client, sock)
        self.deliver = _send_padded


def _relay_host(bind_host: str, family: int) -> tuple[socket.AddressFamily, str]:
    af = socket.AF_INET6 if family == 6 else socket.AF_INET
    if (af == socket.AF_INET6) != (":" in bind_host):
        bind_host = "::" if af == socket.AF_INET6 else "0.0.0.0"
    return af, bind_host


def bind_relay_socket(bind_host: str, family: int, even: bool, port: int = 0) -> socket.socket:
    """A non-blocking UDP socket for a relay (on an even port if asked, RFC 8656 §14.6)."""
    af, host = _relay_host(bind_host, family)
    for _ in range(EVEN_PORT_ATTEMPTS if even else 1):
        sock = socket.socket(af, _NONBLOCKING_DGRAM)
        try:
            if af == socket.AF_INET6:
                # an IPv6 relay relays to IPv6 peers only: never to IPv4 through a mapped address
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        if not even or sock.getsockname()[1] % 2 == 0:
            tune_udp_socket(sock)
            return sock
        sock.close()
    raise OSError("no even relay port found")


def bind_even_pair(bind_host: str, family: int) -> tuple[socket.socket, socket.socket]:
    """An even relay port P and a socket held on P + 1 (EVEN-PORT with R, RFC 8656 §14.6)."""
    for _ in range(EVEN_PORT_ATTEMPTS):
        sock = bind_relay_socket(bind_host, family, True)
        try:
            return sock, bind_relay_socket(bind_host, family, False, sock.getsockname()[1] + 1)
        except OSError:
            sock.close()
    raise OSError("no free pair of relay ports found")
