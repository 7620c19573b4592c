"""Listeners of stunnerd's network edge on a fake loop and fake transports (no sockets, no sleeps).

Each listener runs its real `TurnEngine`; `MockLoop` plays the event loop and relay sockets are
`FakeSocket`s, so a test drives a whole Allocate → ChannelBind → ChannelData exchange by hand and
moves the clock to fire idle timeouts and allocation expiry. `TurnClient` builds the requests
(aioice's encoder, an independent one) and answers the 401 challenge as real clients do.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aioice import stun

from stunnerd.net.guard import ClientLimits, ConnectionLimits
from stunnerd.net.listener import Listener, ListenerContext, ListenerOptions, ListenerSpec
from stunnerd.net.stream import StreamClientProtocol, StreamListener
from stunnerd.net.tuning import ServerTuning
from stunnerd.net.udp import UdpListener
from stunnerd.turn.engine import Policies
from stunnerd.turn.policies import AllowAllPeers, StaticAuthenticator, UserQuota, UserUsage
from support.fake_net import FakeSocket, MockDatagramTransport, MockLoop, MockTransport

REALM = "stunner.l7mp.io"
USER, PASSWORD = "user1", "pass1"
RELAY_IP = "192.0.2.1"
PEER = ("198.51.100.7", 5000)
CHANNEL = 0x4000
IDLE_S = 60.0
CLIENT = ("192.0.2.10", 40000)
OTHER = ("192.0.2.11", 40001)


def policies() -> Policies:
    return Policies(StaticAuthenticator(REALM, USER, PASSWORD), AllowAllPeers(), UserQuota(0))


def limits(**connection: Any) -> ClientLimits:
    return ClientLimits(connection=ConnectionLimits(**connection))


def spec(protocol: str, **kw: Any) -> ListenerSpec:
    return ListenerSpec(
        name=f"{protocol.lower()}-listener",
        protocol=protocol,
        relay_ip=RELAY_IP,
        port=3478,
        bind_host="127.0.0.1",
        **kw,
    )


class RelayPorts:
    """Hands out `FakeSocket`s where the listener would bind relay sockets."""

    def __init__(self) -> None:
        self.next_port = 50000
        self.opened: list[FakeSocket] = []

    def bind(self, bind_host: str, family: int, even: bool, port: int = 0) -> FakeSocket:
        self.next_port += 2 if even else 1
        sock = FakeSocket(
            (bind_host, port or self.next_port),
            socket.AF_INET6 if family == 6 else socket.AF_INET,
        )
        self.opened.append(sock)
        return sock

    def bind_pair(self, bind_host: str, family: int) -> tuple[FakeSocket, FakeSocket]:
        sock = self.bind(bind_host, family, True)
        return sock, self.bind(bind_host, family, False, sock.sockname[1] + 1)


def build(
    kind: type[Listener],
    protocol: str,
    loop: MockLoop,
    ports: RelayPorts,
    *,
    client_limits: ClientLimits | None = None,
    tuning: ServerTuning | None = None,
    **kw: Any,
) -> Any:
    """A listener of `kind` on the fake loop, binding its relays through `ports`."""
    options = ListenerOptions(
        limits=client_limits or ClientLimits(),
        tuning=tuning or ServerTuning(fastpath=False, udp_gso=False),
    )
    context = ListenerContext(loop, UserUsage(), clock_offset_s=0.0)  # type: ignore[arg-type]
    listener = kind(spec(protocol, **kw), policies(), options, context, nonce_secret=b"n" * 32)
    listener.opener.bind_socket = ports.bind  # type: ignore[assignment]
    listener.opener.bind_pair = ports.bind_pair  # type: ignore[assignment]
    return listener


@dataclass
class TurnClient:
    """A scripted TURN client: builds requests, learns the nonce from a 401 and signs after."""

    send: Callable[[bytes], None]
    receive: Callable[[], list[bytes]]  # what the server sent since the last call
    loop: MockLoop
    nonce: bytes | None = None
    realm: str | None = None
    log: list[stun.Message] = field(default_factory=list)

    @property
    def key(self) -> bytes:
        return hashlib.md5(f"{USER}:{REALM}:{PASSWORD}".encode()).digest()

    def build(self, method: stun.Method, attrs: dict[str, Any]) -> bytes:
        msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))
        if self.nonce is not None:
            msg.attributes.update({"USERNAME": USER, "REALM": self.realm, "NONCE": self.nonce})
            msg.add_message_integrity(self.key)
        return bytes(msg)

    def exchange(self, raw: bytes) -> stun.Message:
        self.send(raw)
        self.loop.run_ready()  # a relay opens in a task
        replies = self.receive()
        assert len(replies) == 1, f"expected one answer, got {len(replies)}"
        reply = stun.parse_message(replies[0])
        self.log.append(reply)
        return reply

    def request(self, method: stun.Method, attrs: dict[str, Any] | None = None) -> stun.Message:
        reply = self.exchange(self.build(method, attrs or {}))
        if reply.message_class == stun.Class.ERROR and reply.error_code in (401, 438):
            self.nonce = reply.attributes["NONCE"]
            self.realm = reply.attributes["REALM"]
            reply = self.exchange(self.build(method, attrs or {}))
        return reply

    def allocate(self, lifetime_s: int = 600) -> stun.Message:
        reply = self.request(
            stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "LIFETIME": lifetime_s}
        )
        assert reply.message_class == stun.Class.RESPONSE, reply
        return reply

    def channel_bind(self, peer: tuple[str, int] = PEER, channel: int = CHANNEL) -> None:
        reply = self.request(
            stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": channel, "XOR-PEER-ADDRESS": peer}
        )
        assert reply.message_class == stun.Class.RESPONSE, reply


def binding_request() -> bytes:
    return bytes(stun.Message(stun.Method.BINDING, stun.Class.REQUEST))


def channel_data(payload: bytes, channel: int = CHANNEL, *, pad: bool) -> bytes:
    frame = channel.to_bytes(2, "big") + len(payload).to_bytes(2, "big") + payload
    return frame + bytes(-len(payload) % 4) if pad else frame


# ------------------------------------------------------------------ TURN-UDP


async def udp_listener(
    loop: MockLoop, ports: RelayPorts, **kw: Any
) -> tuple[UdpListener, FakeSocket]:
    """A started TURN-UDP listener serving a `FakeSocket`; `kw` goes to its spec."""
    listener: UdpListener = build(UdpListener, "TURN-UDP", loop, ports, **kw)
    sock = FakeSocket(("127.0.0.1", 3478))
    listener.inherited_socket = sock  # type: ignore[assignment]
    await listener.start()
    return listener, sock


def transport_of(listener: UdpListener) -> MockDatagramTransport:
    assert isinstance(listener.transport, MockDatagramTransport)
    return listener.transport


def client_at(listener: UdpListener, loop: MockLoop, addr: tuple[str, int] = CLIENT) -> TurnClient:
    transport = transport_of(listener)
    seen = [len(transport.sent)]

    def send(data: bytes) -> None:
        assert listener.protocol is not None
        listener.protocol.datagram_received(data, addr)

    def receive() -> list[bytes]:
        new = [data for data, to in transport.sent[seen[0] :] if to == addr]
        seen[0] = len(transport.sent)
        return new

    return TurnClient(send, receive, loop)


def feed(listener: UdpListener, data: bytes, addr: tuple[str, int] = CLIENT) -> None:
    """A datagram from `addr`, as the listener's socket would deliver it."""
    assert listener.protocol is not None
    listener.protocol.datagram_received(data, addr)


# ------------------------------------------------------------------ TURN-TCP

# No rate floor, so that only the guard a test looks at can close a connection.
PATIENT = limits(preauth_min_bytes_per_s=0.0, first_message_timeout_s=1000.0)


def tcp_listener(
    loop: MockLoop, ports: RelayPorts, client_limits: ClientLimits | None = None
) -> StreamListener:
    listener: StreamListener = build(
        StreamListener,
        "TURN-TCP",
        loop,
        ports,
        client_limits=client_limits or PATIENT,
        tuning=ServerTuning(fastpath=False, udp_gso=False, client_idle_timeout_s=IDLE_S),
    )
    return listener


def connect(
    listener: StreamListener, loop: MockLoop, peer: tuple[str, int] = CLIENT
) -> tuple[StreamClientProtocol, MockTransport]:
    proto = StreamClientProtocol(listener)
    transport = MockTransport(loop, peer).attach(proto)
    return proto, transport
