"""Fuzz targets: every parser that takes bytes from the network or from a user, one function each.

Each target takes one input (bytes) and feeds it to the real code the way the service does; it
swallows only the errors that code documents for bad input (a decode error, `ConfigError`, a
malformed CDS envelope's `EnvelopeError`, a CDS resync). Anything else escaping a target is a bug.
The net-side targets (the TCP/TLS framer and the DTLS record path) drive real listeners of an
in-process `TurnServer` and turn any `log.exception` of stunnerd (the listener's guard around the
engine) into a crash too, so a swallowed engine error is not missed.

Run one target under atheris (coverage guided, libFuzzer arguments after the name):

    python -m bench.fuzz_targets stun -runs=1000000 [CORPUS_DIR]

`python -m bench fuzz` runs them all and reports the counts; `seeds(name)` gives each target a
small corpus of valid inputs to start from.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import importlib
import json
import logging
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
REALM, USER, PASSWORD = "fuzz.example", "user-1", "pass-1"
CLIENT = ("192.0.2.9", 4000)
NOW = 1000.0


class TargetCrashError(Exception):
    """A target saw the code under test fail in a way it must not (re-raised to the fuzzer)."""


# --------------------------------------------------------------------------------- STUN / TURN


def _tlv(attr_type: int, value: bytes) -> bytes:
    return struct.pack("!HH", attr_type, len(value)) + value + bytes(-len(value) % 4)


def sign(msg_type: int, tid: bytes, body: bytes, nonce: bytes) -> bytes:
    """A request whose attributes are `body` plus valid long-term credentials (RFC 8489 §9.2)."""
    body = body + bytes(-len(body) % 4)
    attrs = body + _tlv(0x0006, USER.encode()) + _tlv(0x0014, REALM.encode()) + _tlv(0x0015, nonce)
    header = struct.pack("!HHI12s", msg_type & 0x3FFF, len(attrs) + 24, 0x2112A442, tid)
    key = hashlib.md5(f"{USER}:{REALM}:{PASSWORD}".encode()).digest()
    mac = hmac.new(key, header + attrs, hashlib.sha1).digest()
    return header + attrs + b"\x00\x08\x00\x14" + mac


class StunTarget:
    """The STUN/TURN codec and the sans-IO engine, with and without valid credentials.

    The first input byte picks the mode: raw bytes as a client datagram, or a request signed
    with the right key (so that Allocate, Refresh, CreatePermission, ChannelBind and Send are
    reached with fuzzed attributes), or bytes from a peer to a live allocation.
    """

    def __init__(self) -> None:
        from stunnerd.turn import codec
        from stunnerd.turn import effects as fx
        from stunnerd.turn.engine import Policies, TurnEngine
        from stunnerd.turn.policies import AllowAllPeers, StaticAuthenticator, UserQuota

        self.codec = codec
        self.fx = fx
        self.engine = TurnEngine(
            relay_ip="192.0.2.1",
            nonce_secret=b"n" * 32,
            policies=Policies(
                StaticAuthenticator(REALM, USER, PASSWORD), AllowAllPeers(), UserQuota()
            ),
        )
        self.nonce = self._fetch_nonce()
        self.inputs = 0

    def _fetch_nonce(self) -> bytes:
        request = self.codec.Message(
            self.codec.Method.ALLOCATE,
            self.codec.Class.REQUEST,
            attributes={"REQUESTED-TRANSPORT": self.codec.TRANSPORT_UDP},
        )
        for effect in self.engine.handle_client(bytes(request), CLIENT, NOW):
            if isinstance(effect, self.fx.SendToClient):
                answer = self.codec.decode(effect.data).message
                return bytes(answer.attributes["NONCE"])
        raise TargetCrashError("the engine sent no 401 with a NONCE")

    def _apply(self, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, self.fx.OpenRelay):  # the edge's half of a two-phase Allocate
                self.engine.relay_opened(effect.client, 50000, NOW)

    def __call__(self, data: bytes) -> None:
        codec = self.codec
        self.inputs += 1
        if self.inputs % 5000 == 0:  # start afresh now and then: bounded state, steady speed
            self.__init__()  # type: ignore[misc]
        if not data:
            return
        mode, rest = data[0] % 4, data[1:]
        with contextlib.suppress(codec.StunDecodeError, codec.StunBadRequestError):
            codec.decode(rest)
        fast = codec.parse_send_indication(rest)
        if fast is not None and codec.decode(rest).message.attributes.get("DATA") != fast[1]:
            raise TargetCrashError("the Send fast path disagrees with the decoder")
        codec.parse_channel_data(rest)
        if mode == 0:
            self._apply(self.engine.handle_client(rest, CLIENT, NOW))
        elif mode in (1, 2) and len(rest) >= 2:
            methods = (0x001, 0x003, 0x004, 0x006, 0x008, 0x009, 0x016)
            method = methods[rest[0] % len(methods)]
            tid = hashlib.sha1(rest).digest()[:12]
            self._apply(
                self.engine.handle_client(sign(method, tid, rest[1:], self.nonce), CLIENT, NOW)
            )
        else:
            self._apply(self.engine.handle_peer(CLIENT, ("198.51.100.1", 7), rest, NOW))
        self._apply(self.engine.tick(NOW + (data[0] >> 2)))


# ------------------------------------------------------------------------- in-process stunnerd


class _ErrorTrap(logging.Handler):
    """Collects stunnerd's ERROR records (e.g. "engine failed on a client message")."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def check(self) -> None:
        if self.records:
            record = self.records[0]
            self.records.clear()
            raise TargetCrashError(self.format(record))


class _Recorder(asyncio.Transport):
    """The client side of one stream connection as the server sees it: records what it sends."""

    def __init__(self, peer: tuple[str, int]) -> None:
        super().__init__()
        self.peer = peer
        self.closed = False
        self.sent = 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer, "sockname": ("127.0.0.1", 3478)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent += len(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _LiveServer:
    """A real `TurnServer` with TCP and DTLS listeners on loopback, driven synchronously."""

    def __init__(self) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        from fixtures.stunnerd.inproc import make_config, running_server

        self.loop = asyncio.new_event_loop()
        config = make_config(("TURN-TCP", "TURN-DTLS"))
        self._cm = running_server(config)
        self.server = self.loop.run_until_complete(self._cm.__aenter__())
        self.listeners = {
            spec.protocol: self.server.listeners[spec.name] for spec in config.listeners
        }
        self.trap = _ErrorTrap()
        logging.getLogger("stunnerd").addHandler(self.trap)
        logging.getLogger("stunnerd").setLevel(logging.ERROR)
        self.inputs = 0

    def settle(self) -> None:
        """Let the callbacks the input scheduled run (e.g. a relay opening): one turn of the
        loop, without a task per input."""
        self.loop.call_soon(self.loop.stop)
        self.loop.run_forever()


def _chunks(data: bytes) -> list[bytes]:
    """Split an input into reads: a 0xFF byte followed by a length byte marks a cut."""
    out, start = [], 0
    cut = data.find(0xFF, 0, len(data) - 1)
    while cut >= 0:
        out.append(data[start:cut])
        start = cut + 2
        cut = data.find(0xFF, start, len(data) - 1)
    out.append(data[start:])
    return out


class FramerTarget:
    """The TCP/TLS de-framer of stunnerd (the same protocol object serves both), fed in pieces."""

    def __init__(self) -> None:
        from stunnerd.net.stream import StreamClientProtocol

        self.live = _LiveServer()
        self.listener = self.live.listeners["TURN-TCP"]
        self.protocol_class = StreamClientProtocol
        self.port = 10000

    def __call__(self, data: bytes) -> None:
        self.port = 10000 + (self.port + 1) % 50000
        transport = _Recorder(("127.0.0.1", self.port))
        proto = self.protocol_class(self.listener)  # type: ignore[arg-type]
        proto.connection_made(transport)
        try:
            for piece in _chunks(data):
                if transport.closed:
                    break
                proto.data_received(piece)
            self.live.settle()
        finally:
            proto.connection_lost(None)
        self.live.trap.check()


class DtlsTarget:
    """The DTLS record path: ClientHellos and records from strangers, and fuzzed plaintext (or
    raw records) inside an established session whose handshake ran for real in memory."""

    def __init__(self) -> None:
        from OpenSSL import SSL

        self.ssl = SSL
        self.live = _LiveServer()
        listener: Any = self.live.listeners["TURN-DTLS"]
        self.listener = listener
        self.proto = listener.protocol
        self.addr = ("127.0.0.1", 9)  # the discard port: what the server answers goes nowhere
        self.client: Any = None

    def _handshake(self) -> None:
        """Run a real DTLS handshake against the listener, carrying datagrams by hand."""
        SSL = self.ssl
        ctx = SSL.Context(SSL.DTLS_METHOD)
        ctx.set_verify(SSL.VERIFY_NONE, lambda *a: True)
        client = SSL.Connection(ctx, None)
        client.set_connect_state()
        outgoing: list[bytes] = []
        original = self.listener.sendto
        self.listener.sendto = lambda data, addr: outgoing.append(bytes(data))
        try:
            for _ in range(20):
                try:
                    client.do_handshake()
                    break
                except SSL.WantReadError:
                    pass
                while True:
                    try:
                        self.proto.datagram_received(client.bio_read(65536), self.addr)
                    except SSL.WantReadError:
                        break
                # established sessions send through their own socket path: collect both
                session = self.listener.sessions.get(self.addr)
                if session is not None:
                    while True:
                        try:
                            outgoing.append(session.conn.bio_read(65536))
                        except SSL.WantReadError:
                            break
                for datagram in outgoing:
                    client.bio_write(datagram)
                outgoing.clear()
        finally:
            self.listener.sendto = original
        self.client = client

    def __call__(self, data: bytes) -> None:
        SSL = self.ssl
        if not data:
            return
        mode, rest = data[0] % 3, data[1:]
        if mode == 0:  # a stranger's datagrams
            for piece in _chunks(rest):
                self.proto.datagram_received(piece, ("127.0.0.1", 10 + data[0]))
        else:
            if self.addr not in self.listener.sessions or self.client is None:
                self._handshake()
            if mode == 1:  # fuzzed plaintext inside the session
                for piece in _chunks(rest):
                    try:
                        self.client.send(piece)
                        while True:
                            self.proto.datagram_received(self.client.bio_read(65536), self.addr)
                    except SSL.WantReadError:
                        pass
                    except SSL.Error:
                        self.client = None
                        break
            else:  # raw bytes as records of the established session
                for piece in _chunks(rest):
                    self.proto.datagram_received(piece, self.addr)
        self.live.settle()
        self.live.trap.check()


# ------------------------------------------------------------------------------- configs, CDS


def config_target(data: bytes) -> None:
    """stunnerd's config parser (YAML or JSON, v1 and v1alpha1, env substitution)."""
    from stunner_common.config import ConfigError, parse_config
    from stunner_common.contracts.listener_address import POD_ADDRESS_ENV

    try:
        config = parse_config(data, env={POD_ADDRESS_ENV: "192.0.2.1", "A": "${B}", "B": "$A"})
    except ConfigError:
        return
    config.canonical_json()


class CdsTarget:
    """The CDS wire messages as a watcher handles them: each line is one frame, applied in turn
    to the state a stunnerd holds (snapshots, JSON patches, deletes), then parsed as a config."""

    def __init__(self) -> None:
        from stunner_common.cds.wire import EnvelopeError, parse_envelope
        from stunner_common.config import ConfigError, parse_config
        from stunner_common.io.cds.client import CdsProtocolError, DeltaState

        self.errors = (EnvelopeError,)
        self.protocol_error = CdsProtocolError
        self.config_error = ConfigError
        self.state_class = DeltaState
        self.parse_envelope = parse_envelope
        self.parse_config = parse_config

    def __call__(self, data: bytes) -> None:
        state = self.state_class()
        for frame in data.split(b"\n"):
            try:
                envelope = self.parse_envelope(frame)
            except self.errors:
                continue
            try:
                change = state.apply(envelope)
            except self.protocol_error:
                state.reset()
                continue
            if change is not None and change.config is not None:
                with contextlib.suppress(self.config_error):
                    self.parse_config(change.config, expand_env=False)


def manifest_target(data: bytes) -> None:
    """The operator's manifest loader (local mode), as it reads a file from disk."""
    from stunner_operator.manifests.loader import parse_manifests

    try:
        text = data.decode()
    except UnicodeDecodeError:
        return  # the loader gets text; decoding is the file reader's business
    parse_manifests(text, "fuzz.yaml")


TARGETS: dict[str, Callable[[], Callable[[bytes], None]]] = {
    "stun": StunTarget,
    "framer": FramerTarget,
    "dtls": DtlsTarget,
    "config": lambda: config_target,
    "cds": CdsTarget,
    "manifests": lambda: manifest_target,
}


# ------------------------------------------------------------------------------------ seeds


def seeds(name: str) -> list[bytes]:
    """Valid inputs each target starts from."""
    if name in ("stun", "framer", "dtls"):
        from aioice import stun

        out = []
        requests: list[tuple[stun.Method, dict[str, Any]]] = [
            (stun.Method.BINDING, {}),
            (stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "LIFETIME": 600}),
            (stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": ("127.0.0.1", 9)}),
            (
                stun.Method.CHANNEL_BIND,
                {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": ("127.0.0.1", 9)},
            ),
            (stun.Method.REFRESH, {"LIFETIME": 0}),
        ]
        for method, attrs in requests:
            out.append(bytes(stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))))
        out.append(
            bytes(
                stun.Message(
                    stun.Method.SEND,
                    stun.Class.INDICATION,
                    attributes={"XOR-PEER-ADDRESS": ("127.0.0.1", 9), "DATA": b"hi"},
                )
            )
        )
        out.append(b"\x40\x00\x00\x04data")
        return [b"\x00" + s for s in out] + [b"\x01" + s[20:] for s in out[:5]]
    if name == "config":
        return [json.dumps(_sample_config()).encode(), _sample_yaml().encode()]
    if name == "cds":
        config = _sample_config()
        return [
            b"\n".join(
                [
                    json.dumps(
                        {"type": "snapshot", "id": "ns/gw", "rev": 1, "config": config}
                    ).encode(),
                    json.dumps(
                        {
                            "type": "patch",
                            "id": "ns/gw",
                            "rev": 2,
                            "patch": [{"op": "replace", "path": "/auth/realm", "value": "x"}],
                        }
                    ).encode(),
                    json.dumps({"type": "delete", "id": "ns/gw", "rev": 3}).encode(),
                ]
            )
        ]
    if name == "manifests":
        return [p.read_bytes() for p in sorted((REPO / "examples/local").glob("*.yaml"))]
    raise KeyError(name)


def _sample_config() -> dict[str, Any]:
    from stunner_common.contracts.listener_address import POD_ADDRESS

    return {
        "version": "v1",
        "admin": {"name": "ns/gw", "loglevel": "all:INFO", "user_quota": 3},
        "auth": {
            "type": "static",
            "realm": REALM,
            "credentials": {"username": USER, "password": PASSWORD},
        },
        "listeners": [
            {
                "name": "ns/gw/udp",
                "protocol": "TURN-UDP",
                "address": POD_ADDRESS,
                "port": 3478,
                "routes": ["ns/route"],
            }
        ],
        "clusters": [{"name": "ns/route", "type": "STATIC", "endpoints": ["10.0.0.0/8:<1-2>"]}],
    }


def _sample_yaml() -> str:
    return (
        "version: v1alpha1\nadmin:\n  loglevel: all:DEBUG\nauth:\n  type: longterm\n"
        "  realm: r\n  credentials:\n    secret: s\nlisteners:\n  - name: l\n    protocol: UDP\n"
        "    port: 3478\n    routes: [c]\nclusters:\n  - name: c\n    type: STRICT_DNS\n"
        "    endpoints: [example.com]\n"
    )


INSTRUMENTED = (
    "aioice.stun",
    "stunnerd.turn.engine",
    "stunnerd.net.stream",
    "stunnerd.net.dtls",
    "stunner_common.config",
    "stunner_common.io.cds.client",
    "stunner_operator.manifests.loader",
)


def main(argv: list[str]) -> None:
    import atheris  # type: ignore[import-untyped]

    name, libfuzzer_args = argv[1], argv[2:]
    with atheris.instrument_imports(
        include=["aioice", "stunnerd", "stunner_common", "stunner_operator"]
    ):
        for module in INSTRUMENTED:
            importlib.import_module(module)
    target = TARGETS[name]()
    atheris.Setup([argv[0], *libfuzzer_args], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
