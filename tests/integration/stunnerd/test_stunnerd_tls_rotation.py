"""A TURN-TLS certificate change is applied in place: live allocations keep relaying and new
connections are served the new certificate (upstream restarted the listener instead)."""

from __future__ import annotations

import asyncio
import base64
import copy
import ssl
from pathlib import Path

import pytest
from aioice.turn import create_turn_endpoint

from stunner_common.config import self_signed_pair
from support.echo import UdpEcho
from support.stunnerd_process import (
    PASSWORD,
    USER,
    EchoAllocation,
    ManagedStunnerd,
    TurnReceiver,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = pytest.mark.integration


def der(cert_b64: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(base64.b64decode(cert_b64).decode())


async def test_a_rotated_certificate_keeps_tls_allocations_and_serves_new_connections(
    tmp_path: Path, echo: UdpEcho
) -> None:
    port = listener_ports("tls")["tls"]
    config = base_config(health_port(), {"tls": port})
    cert_a, key_a = self_signed_pair("127.0.0.1")
    config["listeners"][0].update(protocol="TURN-TLS", cert=cert_a, key=key_a)
    server = ManagedStunnerd(tmp_path, config)
    try:
        await server.ready()
        client_ctx = ssl.create_default_context()
        client_ctx.check_hostname = False
        client_ctx.verify_mode = ssl.CERT_NONE
        async with asyncio.timeout(10):
            transport, receiver = await create_turn_endpoint(
                TurnReceiver,
                server_addr=("127.0.0.1", port),
                username=USER,
                password=PASSWORD,
                ssl=client_ctx,
                transport="tcp",
            )
        alloc = EchoAllocation(transport, receiver, (echo.host, echo.port))
        assert await alloc.echoes()
        served = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
        assert ssl.PEM_cert_to_DER_cert(served) == der(cert_a)

        cert_b, key_b = self_signed_pair("127.0.0.1")
        rotated = copy.deepcopy(server.config)
        rotated["listeners"][0].update(cert=cert_b, key=key_b)
        await server.write(rotated)
        assert await alloc.echoes(), "the TLS allocation survived the certificate change"
        served = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
        assert ssl.PEM_cert_to_DER_cert(served) == der(cert_b)
        assert "listener tls: closed" not in server.log()
        await alloc.close()
    finally:
        await server.close()
