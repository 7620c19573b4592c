"""20,000 mutated datagrams at a running stunnerd; a legitimate client still allocates and relays.

The datagrams are valid STUN/TURN requests, indications, ChannelData and DTLS ClientHellos with
bytes flipped, cut or appended (seeded, so a failure replays), plus plain random bytes, sent to the
TURN-UDP and TURN-DTLS listeners of a real stunnerd process. Afterwards the process must be alive,
must not have logged an engine failure, and must serve a new allocation end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from pathlib import Path
from typing import Any

import pytest
from aioice import stun
from aioice.turn import create_turn_endpoint
from OpenSSL import SSL

from support.echo import echo_peer
from support.stunnerd_process import PASSWORD, USER, start_stunnerd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DATAGRAMS = 20_000


def seeds() -> list[bytes]:
    out = []
    requests: list[tuple[stun.Method, dict[str, Any]]] = [
        (stun.Method.BINDING, {}),
        (stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "LIFETIME": 600}),
        (stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": ("127.0.0.1", 9)}),
        (stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": ("::1", 9)}),
        (stun.Method.REFRESH, {"LIFETIME": 0}),
    ]
    for method, attrs in requests:
        msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))
        out.append(bytes(msg))
        msg.attributes.update({"USERNAME": USER, "REALM": "stunner.l7mp.io", "NONCE": b"0" * 24})
        msg.add_message_integrity(b"k" * 16)
        msg.add_fingerprint()
        out.append(bytes(msg))
    out.append(
        bytes(
            stun.Message(
                stun.Method.SEND,
                stun.Class.INDICATION,
                attributes={"XOR-PEER-ADDRESS": ("127.0.0.1", 9), "DATA": b"x" * 40},
            )
        )
    )
    out.append(b"\x40\x00\x00\x08datadata")
    return out


def client_hello() -> bytes:
    ctx = SSL.Context(SSL.DTLS_METHOD)
    conn = SSL.Connection(ctx, None)
    conn.set_connect_state()
    with contextlib.suppress(SSL.WantReadError):
        conn.do_handshake()
    return conn.bio_read(65536)


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(4)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op == 1 and buf:
            del buf[rng.randrange(len(buf) + 1) :]
        elif op == 2:
            buf += rng.randbytes(rng.randint(1, 32))
        elif buf:  # a length field that lies
            pos = rng.randrange(len(buf))
            buf[pos : pos + 2] = rng.randbytes(2)
    return bytes(buf)


async def test_stunnerd_survives_20000_mutated_datagrams_and_still_relays(tmp_path: Path) -> None:
    server = start_stunnerd(
        tmp_path,
        {
            "type": "static",
            "realm": "stunner.l7mp.io",
            "credentials": {"username": USER, "password": PASSWORD},
        },
    )
    rng = random.Random(15)
    stun_seeds, hello = seeds(), client_hello()
    targets = [("127.0.0.1", server.ports["TURN-UDP"]), ("127.0.0.1", server.ports["TURN-DTLS"])]
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(8)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        for i in range(DATAGRAMS):
            kind = rng.randrange(10)
            if kind < 6:
                data = mutate(rng, rng.choice(stun_seeds))
            elif kind < 9:
                data = mutate(rng, hello)
            else:
                data = rng.randbytes(rng.randint(0, 1500))
            target = targets[1] if kind in (6, 7, 8) else targets[0]
            socks[i % len(socks)].sendto(data, target)
            if i % 200 == 199:
                await asyncio.sleep(0.005)  # let the kernel buffers drain: this is not a flood
                for sock in socks:  # and read (discard) what stunnerd answered
                    while True:
                        try:
                            sock.recv(65536, socket.MSG_DONTWAIT)
                        except BlockingIOError:
                            break
        assert server.proc.proc.alive(), server.proc.proc.output()[-3000:]

        class Receiver(asyncio.DatagramProtocol):
            def __init__(self) -> None:
                self.got: asyncio.Queue[bytes] = asyncio.Queue()

            def datagram_received(self, data: bytes, addr: object) -> None:
                self.got.put_nowait(data)

        async with echo_peer() as (_echo, peer):
            transport, receiver = await create_turn_endpoint(
                Receiver, server_addr=targets[0], username=USER, password=PASSWORD
            )
            try:
                transport.sendto(b"still relaying", peer)
                async with asyncio.timeout(10):
                    assert await receiver.got.get() == b"still relaying"
            finally:
                transport.close()
        log = server.proc.proc.output()
        assert server.proc.proc.alive(), log[-3000:]
        assert "Traceback" not in log, log[-5000:]
        assert "failed on a client message" not in log, log[-5000:]
    finally:
        for sock in socks:
            sock.close()
        server.proc.stop()
