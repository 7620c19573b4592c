"""TURN-DTLS with a pyOpenSSL client: the cookie exchange comes first, then STUN over DTLS."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from aioice import stun
from fixtures.stunnerd.inproc import make_config, running_server
from OpenSSL import SSL

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


class DtlsClient:
    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        ctx = SSL.Context(SSL.DTLS_METHOD)
        ctx.set_verify(SSL.VERIFY_NONE, lambda *args: True)
        self.conn = SSL.Connection(ctx, None)
        self.conn.set_connect_state()
        self.received: list[bytes] = []

    async def flush(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = self.conn.bio_read(65536)
            except SSL.WantReadError:
                return
            await loop.sock_sendto(self.sock, data, self.server)

    async def recv_datagram(self) -> bytes:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(5):
            data = await loop.sock_recv(self.sock, 65536)
        self.received.append(data)
        return data

    async def handshake(self) -> None:
        while True:
            try:
                self.conn.do_handshake()
                await self.flush()
                return
            except SSL.WantReadError:
                await self.flush()
            self.conn.bio_write(await self.recv_datagram())

    async def request(self, message: stun.Message) -> stun.Message:
        self.conn.send(bytes(message))
        await self.flush()
        while True:
            self.conn.bio_write(await self.recv_datagram())
            try:
                return stun.parse_message(self.conn.recv(65536))
            except SSL.WantReadError:
                continue


async def test_dtls_hello_gets_a_cookie_first_then_stun_flows_over_dtls(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-DTLS",))
    port = config.listeners[0].port
    async with running_server(config) as server:
        listener = server.listeners["turn-dtls"]
        client = DtlsClient(("127.0.0.1", port))
        try:
            await client.handshake()
            first = client.received[0]
            assert first[0] == 22  # a handshake record...
            assert first[13] == 3  # ...carrying HelloVerifyRequest
            assert len(listener.sessions) == 1  # type: ignore[attr-defined]
            binding = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
            reply = await client.request(binding)
            assert reply.message_class == stun.Class.RESPONSE
            assert reply.attributes["XOR-MAPPED-ADDRESS"] == client.sock.getsockname()
        finally:
            client.sock.close()


async def test_a_spoofed_hello_gets_only_a_small_cookie_and_leaves_no_state(
    no_leaked_tasks: None,
) -> None:
    config = make_config(("TURN-DTLS",))
    port = config.listeners[0].port
    async with running_server(config) as server:
        listener = server.listeners["turn-dtls"]
        client = DtlsClient(("127.0.0.1", port))
        try:
            with contextlib.suppress(SSL.WantReadError):
                client.conn.do_handshake()
            hello = client.conn.bio_read(65536)
            await asyncio.get_running_loop().sock_sendto(client.sock, hello, ("127.0.0.1", port))
            answer = await client.recv_datagram()
            assert answer[13] == 3
            assert len(answer) < 2 * len(hello)  # no certificate flight to a forged source
            assert listener.sessions == {}  # type: ignore[attr-defined]
        finally:
            client.sock.close()
