"""turncat's TCP peers (RFC 6062 TCP allocations) and IPv6 peers and servers, against coturn.

coturn's turnserver implements RFC 6062 and listens on ::1 as well as 127.0.0.1, so it is the
independent server these client features are checked against: each local TCP client gets its
own allocation, Connect and data connection; the server's refusals (403, 442, 447) end turncat
with their own exit codes; IPv6 peers get IPv6 relays (the echo peer hears a ::1 source).
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from support.echo import udp_echo
from support.ports import LOOPBACK, free_port, ipv6_loopback_available
from support.turncat_harness import (
    coturn,
    run_turncat,
    stdin_roundtrip,
    tcp_echo,
    tcp_roundtrip,
    turncat,
    udp_client,
)

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

IPV6 = "::1"


needs_ipv6 = pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback (::1)")


@pytest.mark.parametrize("transport", ["tcp", "tls"])
async def test_each_tcp_client_gets_its_own_connection_to_a_tcp_peer(
    tmp_path: Path, transport: str
) -> None:
    local_port = free_port()
    with coturn(tmp_path, tls=transport == "tls") as server:
        flags = ["--ca", str(server.cert)] if server.cert else []
        async with (
            tcp_echo() as echo,
            turncat(f"tcp://{LOOPBACK}:{local_port}", server.uri(transport), echo.url, *flags),
        ):
            # The startup check connected once through its own allocation.
            assert echo.connections == 1
            big = os.urandom(200_000)  # many segments: the byte stream must arrive intact
            replies = await asyncio.gather(
                tcp_roundtrip(local_port, b"first client"),
                tcp_roundtrip(local_port, b"second client"),
                tcp_roundtrip(local_port, big),
            )
            assert list(replies) == [b"first client", b"second client", big]
            assert echo.connections == 4
            # Every connection came from its own relayed address (its own allocation).
            assert len(set(echo.sources)) == 4
            assert all(host == LOOPBACK for host, _ in echo.sources)
    log = server.proc.output()
    assert log.count("incoming packet CONNECT processed, success") == 4, log
    assert log.count("incoming packet CONNECTION_BIND processed, success") == 4, log


async def test_stdin_reaches_a_tcp_peer_and_its_bytes_come_back_on_stdout(
    tmp_path: Path,
) -> None:
    with coturn(tmp_path) as server:
        async with tcp_echo() as echo:
            reply, rc, err = await stdin_roundtrip(server.uri("tcp"), echo.url, b"to tcp\n")
    assert reply == b"to tcp\n"
    assert rc == 0, err
    assert echo.connections == 1


async def test_a_tcp_peer_nobody_listens_on_exits_7_with_447(tmp_path: Path) -> None:
    closed = free_port()
    with coturn(tmp_path) as server:
        rc, err = await run_turncat("-", server.uri("tcp"), f"tcp://{LOOPBACK}:{closed}")
    assert rc == 7, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"turncat: TCP peer {LOOPBACK}:{closed}: the TURN server could not")
    assert "447" in last


async def test_a_server_without_tcp_relays_exits_6_with_442(tmp_path: Path) -> None:
    with coturn(tmp_path, extra=["--no-tcp-relay"]) as server:
        async with tcp_echo() as echo:
            rc, err = await run_turncat("-", server.uri("tcp"), echo.url)
    assert rc == 6, err
    last = err.strip().splitlines()[-1]
    assert "does not offer a TCP relay (RFC 6062)" in last
    assert "442" in last
    assert echo.connections == 0


async def test_a_denied_tcp_peer_exits_4(tmp_path: Path) -> None:
    with coturn(tmp_path, extra=["--denied-peer-ip=127.0.0.1"]) as server:
        async with tcp_echo() as echo:
            rc, err = await run_turncat("-", server.uri("tcp"), echo.url)
    assert rc == 4, err
    assert "not allowed" in err.strip().splitlines()[-1]
    assert echo.connections == 0


@needs_ipv6
@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_ipv6_server_and_ipv6_udp_peer(tmp_path: Path, transport: str) -> None:
    with coturn(tmp_path, host=IPV6) as server:
        assert server.uri(transport).startswith("turn://user1:passwd1@[::1]:")
        async with udp_echo(IPV6) as echo:
            local_port = free_port(socket.SOCK_DGRAM)
            async with turncat(f"udp://{LOOPBACK}:{local_port}", server.uri(transport), echo.url):
                client = await udp_client(LOOPBACK, local_port)
                try:
                    assert await client.roundtrip(b"over ipv6") == b"over ipv6"
                finally:
                    client.close()
            # The relay that reached the peer is an IPv6 one.
            assert echo.protocol.sources
            assert {host for host, _ in echo.protocol.sources} == {IPV6}


@needs_ipv6
async def test_ipv6_tcp_peer_through_an_ipv6_server(tmp_path: Path) -> None:
    with coturn(tmp_path, host=IPV6) as server:
        async with tcp_echo(IPV6) as echo:
            reply, rc, err = await stdin_roundtrip(server.uri("tcp"), echo.url, b"v6 stream\n")
    assert (reply, rc) == (b"v6 stream\n", 0), err
    assert {host for host, _ in echo.sources} == {IPV6}


@needs_ipv6
async def test_ipv4_peer_through_an_ipv6_server_and_ipv6_peer_through_an_ipv4_one(
    tmp_path: Path,
) -> None:
    with coturn(tmp_path, host=IPV6) as server:
        async with udp_echo(LOOPBACK) as echo:
            reply, rc, err = await stdin_roundtrip(server.uri("udp"), echo.url, b"v4 peer\n")
            assert (reply, rc) == (b"v4 peer\n", 0), err
            assert {host for host, _ in echo.protocol.sources} == {LOOPBACK}
    (tmp_path / "v4").mkdir()
    with coturn(tmp_path / "v4", host=LOOPBACK) as server:
        async with udp_echo(IPV6) as echo:
            reply, rc, err = await stdin_roundtrip(server.uri("udp"), echo.url, b"v6 peer\n")
            assert (reply, rc) == (b"v6 peer\n", 0), err
            assert {host for host, _ in echo.protocol.sources} == {IPV6}
