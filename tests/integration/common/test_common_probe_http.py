"""The probe HTTP server binds an IP address as it is, and resolves only a host name."""

from __future__ import annotations

import asyncio
import socket

import pytest

from stunner_common.io.probe_http import HttpServer, Response
from support.fresh import modules_after

pytestmark = pytest.mark.integration


async def get(host: str, port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


@pytest.mark.parametrize(
    ("host", "family"),
    [("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6), ("localhost", None)],
)
async def test_the_server_listens_on_an_address_or_a_name(host: str, family: int | None) -> None:
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    server = HttpServer("probe", host, 0, lambda path: Response(200, path.encode()))
    await server.start()
    try:
        port = server.bound_port
        assert port != 0
        sockets = server._server.sockets if server._server is not None else []
        if family is not None:
            assert [(s.family, s.getsockname()[0]) for s in sockets] == [(family, host)]
        assert (await get(host, port, "/live")).endswith(b"/live")
    finally:
        await server.close()


async def test_a_taken_address_fails_to_start_with_the_os_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = HttpServer(
            "probe", "127.0.0.1", taken.getsockname()[1], lambda p: Response(200, b"")
        )
        with pytest.raises(OSError, match="in use"):
            await server.start()


def test_listening_on_an_address_loads_no_idna_codec() -> None:
    modules = modules_after(
        "import asyncio\n"
        "from stunner_common.io.probe_http import HttpServer, Response\n"
        "async def main():\n"
        "    s = HttpServer('probe', '127.0.0.1', 0, lambda p: Response(200, b''))\n"
        "    await s.start()\n"
        "    await s.close()\n"
        "asyncio.run(main())"
    )
    assert "stunner_common.io.probe_http" in modules
    assert "encodings.idna" not in modules
