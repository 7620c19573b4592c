"""turncat against coturn's turnserver, an independent TURN server, on loopback."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from stunner_common.auth import ephemeral_credentials
from support.echo import udp_echo
from support.ports import LOOPBACK, free_port
from support.turncat_harness import (
    PASSWORD,
    REALM,
    SECRET,
    USER,
    coturn,
    run_turncat,
    start_turncat,
    turncat,
    udp_client,
)

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]


def _udp_local() -> str:
    import socket

    return f"udp://{LOOPBACK}:{free_port(socket.SOCK_DGRAM)}"


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("transport", ["udp", "tcp", "tls", "dtls"])
async def test_datagrams_round_trip_through_coturn_over_each_transport(
    tmp_path: Path, transport: str
) -> None:
    with coturn(tmp_path, tls=transport in ("tls", "dtls")) as server:
        async with udp_echo() as echo:
            local = _udp_local()
            flags = ["--ca", str(server.cert)] if server.cert else []
            async with turncat(local, server.uri(transport), echo.url, *flags) as tc:
                client = await udp_client(LOOPBACK, _port(local))
                try:
                    for i in range(5):
                        msg = f"hello {transport} {i}".encode()
                        assert await client.roundtrip(msg) == msg
                finally:
                    client.close()
                assert await tc.stop() == 0
            assert echo.protocol.received >= 5
    log = server.proc.output()
    # Both allocations (the startup check and the client's) were deleted with a Refresh of
    # lifetime 0, not left to expire.
    assert log.count(f"refreshed, realm=<{REALM}>, username=<{USER}>, lifetime=0") == 2, log
    if transport in ("tls", "dtls"):
        assert f"method={'DTLSv1.2' if transport == 'dtls' else 'TLSv1.'}" in log


async def test_tls_without_a_trusted_certificate_is_refused_unless_insecure(
    tmp_path: Path,
) -> None:
    with coturn(tmp_path, tls=True) as server:
        async with udp_echo() as echo:
            rc, err = await run_turncat(_udp_local(), server.uri("tls"), echo.url)
            assert rc == 5, err
            assert "certificate" in err.lower()
            local = _udp_local()
            async with turncat(local, server.uri("tls"), echo.url, "--insecure") as tc:
                client = await udp_client(LOOPBACK, _port(local))
                try:
                    assert await client.roundtrip(b"insecure ok") == b"insecure ok"
                finally:
                    client.close()
                assert await tc.stop() == 0


async def test_dtls_without_a_trusted_certificate_is_refused(tmp_path: Path) -> None:
    with coturn(tmp_path, tls=True) as server:
        async with udp_echo() as echo:
            rc, err = await run_turncat(_udp_local(), server.uri("dtls"), echo.url)
            assert rc == 5, err
            assert "turncat:" in err


async def test_ephemeral_credentials_are_accepted_by_a_rest_secret_server(tmp_path: Path) -> None:
    user, password = ephemeral_credentials(SECRET, ttl_s=600, now=time.time())
    with coturn(tmp_path, secret=SECRET) as server:
        async with udp_echo() as echo:
            local = _udp_local()
            async with turncat(local, server.uri("udp", user, password), echo.url) as tc:
                client = await udp_client(LOOPBACK, _port(local))
                try:
                    assert await client.roundtrip(b"ephemeral") == b"ephemeral"
                finally:
                    client.close()
                assert await tc.stop() == 0


async def test_expired_ephemeral_credentials_fail_with_exit_code_3(tmp_path: Path) -> None:
    user, password = ephemeral_credentials(SECRET, ttl_s=-600, now=time.time())
    with coturn(tmp_path, secret=SECRET) as server:
        async with udp_echo() as echo:
            rc, err = await run_turncat(_udp_local(), server.uri("udp", user, password), echo.url)
    assert rc == 3, err


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_wrong_password_exits_with_code_3_and_one_clear_line(
    tmp_path: Path, transport: str
) -> None:
    with coturn(tmp_path) as server:
        async with udp_echo() as echo:
            rc, err = await run_turncat(
                _udp_local(), server.uri(transport, USER, PASSWORD + "x"), echo.url
            )
    assert rc == 3, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("turncat: authentication failed")
    assert USER in last


async def test_peer_denied_by_the_server_exits_with_code_4(tmp_path: Path) -> None:
    with coturn(tmp_path, extra=["--denied-peer-ip=127.0.0.1"]) as server:
        async with udp_echo() as echo:
            rc, err = await run_turncat(_udp_local(), server.uri("udp"), echo.url)
    assert rc == 4, err
    assert "not allowed" in err.strip().splitlines()[-1]


async def test_unreachable_server_exits_with_code_5() -> None:
    port = free_port()
    async with udp_echo() as echo:
        for transport in ("udp", "tcp"):
            rc, err = await run_turncat(
                _udp_local(),
                f"turn://{USER}:{PASSWORD}@{LOOPBACK}:{port}?transport={transport}",
                echo.url,
                env={"TURNCAT_REQUEST_TIMEOUT_S": "2"},
            )
            assert rc == 5, err


async def test_each_udp_client_gets_its_own_allocation(tmp_path: Path) -> None:
    clients_n = 8
    with coturn(tmp_path) as server:
        async with udp_echo() as echo:
            local = _udp_local()
            async with turncat(local, server.uri("udp"), echo.url) as tc:
                clients = [await udp_client(LOOPBACK, _port(local)) for _ in range(clients_n)]
                try:
                    replies = await asyncio.gather(
                        *(c.roundtrip(f"client {i}".encode()) for i, c in enumerate(clients))
                    )
                    assert replies == [f"client {i}".encode() for i in range(clients_n)]
                    # A second round on the allocations already made.
                    for i, c in enumerate(clients):
                        assert await c.roundtrip(f"again {i}".encode()) == f"again {i}".encode()
                finally:
                    for c in clients:
                        c.close()
                # The echo peer saw one relayed address per local client.
                assert len(echo.protocol.sources) == clients_n
                assert await tc.stop() == 0


async def test_each_tcp_client_gets_its_own_allocation_and_stream(tmp_path: Path) -> None:
    port = free_port()
    with coturn(tmp_path) as server:
        async with (
            udp_echo() as echo,
            turncat(f"tcp://{LOOPBACK}:{port}", server.uri("udp"), echo.url) as tc,
        ):
            conns = [await asyncio.open_connection(LOOPBACK, port) for _ in range(3)]
            try:
                for i, (reader, writer) in enumerate(conns):
                    msg = f"tcp client {i}".encode()
                    writer.write(msg)
                    await writer.drain()
                    async with asyncio.timeout(5):
                        assert await reader.readexactly(len(msg)) == msg
            finally:
                for _, writer in conns:
                    writer.close()
                    await writer.wait_closed()
            assert len(echo.protocol.sources) == 3
            assert await tc.stop(signal.SIGTERM) == 0


async def test_stdin_is_relayed_to_the_peer_and_replies_go_to_stdout(tmp_path: Path) -> None:
    with coturn(tmp_path) as server:
        async with udp_echo() as echo:
            tc = await start_turncat(
                "-", server.uri("udp"), echo.url, stdin=asyncio.subprocess.PIPE
            )
            try:
                assert tc.proc.stdin is not None
                assert tc.proc.stdout is not None
                tc.proc.stdin.write(b"hello from stdin\n")
                await tc.proc.stdin.drain()
                async with asyncio.timeout(10):
                    line = await tc.proc.stdout.readline()
                assert line == b"hello from stdin\n"
                tc.proc.stdin.close()
                assert await tc.wait() == 0, tc.stderr
            finally:
                await tc.aclose()


async def test_idle_udp_client_is_deallocated(tmp_path: Path) -> None:
    with coturn(tmp_path) as server:
        async with udp_echo() as echo:
            local = _udp_local()
            env = {"TURNCAT_CLIENT_IDLE_TIMEOUT_S": "1"}
            async with turncat(local, server.uri("udp"), echo.url, env=env) as tc:
                client = await udp_client(LOOPBACK, _port(local))
                try:
                    assert await client.roundtrip(b"before idle") == b"before idle"
                    await tc.wait_for_line("client idle, deallocating")
                    # A new datagram from the same address gets a fresh allocation.
                    assert await client.roundtrip(b"after idle") == b"after idle"
                finally:
                    client.close()
                assert await tc.stop() == 0
            assert len(echo.protocol.sources) == 2
    # Startup check, the idle client, and the second allocation at exit: all deleted cleanly.
    log = server.proc.output()
    assert log.count(f"refreshed, realm=<{REALM}>, username=<{USER}>, lifetime=0") == 3, log


async def test_allocation_permission_and_channel_are_refreshed(tmp_path: Path) -> None:
    with coturn(tmp_path) as server:
        async with udp_echo() as echo:
            local = _udp_local()
            env = {"TURNCAT_ALLOCATION_REFRESH_S": "0.3", "TURNCAT_PERMISSION_REFRESH_S": "0.3"}
            async with turncat(local, server.uri("udp"), echo.url, "-v", env=env) as tc:
                client = await udp_client(LOOPBACK, _port(local))
                try:
                    assert await client.roundtrip(b"one") == b"one"
                    await tc.wait_for_line("allocation refreshed", count=2)
                    await tc.wait_for_line("permission and channel refreshed", count=2)
                    assert await client.roundtrip(b"two") == b"two"
                finally:
                    client.close()
                assert await tc.stop() == 0


@pytest.mark.parametrize("transport", ["tls", "dtls"])
async def test_sni_names_the_certificate_to_verify_and_turns_scheme_works(
    tmp_path: Path, transport: str
) -> None:
    with coturn(tmp_path, tls=True) as server:
        async with udp_echo() as echo:
            turns = f"turns://{USER}:{PASSWORD}@{LOOPBACK}:{server.tls_port}?transport=" + (
                "tcp" if transport == "tls" else "udp"
            )
            ca = ["--ca", str(server.cert)]
            local = _udp_local()
            async with turncat(local, turns, echo.url, *ca, "--sni", "localhost") as tc:
                client = await udp_client(LOOPBACK, _port(local))
                try:
                    assert await client.roundtrip(b"sni ok") == b"sni ok"
                finally:
                    client.close()
                assert await tc.stop() == 0
            rc, err = await run_turncat(_udp_local(), turns, echo.url, *ca, "--sni", "other.test")
            assert rc == 5, err


async def test_stdin_mode_exits_5_when_the_server_goes_away(tmp_path: Path) -> None:
    with coturn(tmp_path) as server:
        async with udp_echo() as echo:
            tc = await start_turncat(
                "-", server.uri("tcp"), echo.url, stdin=asyncio.subprocess.PIPE
            )
            try:
                assert tc.proc.stdin is not None
                assert tc.proc.stdout is not None
                tc.proc.stdin.write(b"ping\n")
                await tc.proc.stdin.drain()
                async with asyncio.timeout(10):
                    assert await tc.proc.stdout.readline() == b"ping\n"
                server.proc.stop()
                assert await tc.wait() == 5, tc.stderr
                assert "the TURN session was lost" in tc.stderr.splitlines()[-1]
            finally:
                await tc.aclose()
