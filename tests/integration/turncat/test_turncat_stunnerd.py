"""turncat end to end through our own stunnerd on loopback: relay, routing, auth and errors."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stunner_common.auth import ephemeral_credentials
from support.echo import udp_echo
from support.ports import LOOPBACK, free_port, free_udp_tcp_port, ipv6_loopback_available
from support.turncat_harness import (
    PASSWORD,
    REALM,
    SECRET,
    USER,
    Turncat,
    run_turncat,
    self_signed_cert,
    start_logged,
    start_turncat,
    stdin_roundtrip,
    tcp_echo,
    tcp_roundtrip,
    turncat,
    udp_client,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

STUNNERD_ENV = {"STUNNERD_HEALTH_PORT": "0"}


needs_ipv6 = pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback (::1)")


@contextlib.asynccontextmanager
async def stunnerd(
    *args: str, listeners: int = 1, bind: str = LOOPBACK, env: dict[str, str] | None = None
) -> AsyncIterator[Turncat]:
    proc = await start_logged(
        [sys.executable, "-m", "stunnerd", "--bind", bind, *args],
        "ready on port",
        env={**STUNNERD_ENV, **(env or {})},
    )
    try:
        await proc.wait_listening()
        await proc.wait_for_line("ready on port", count=listeners)
        yield proc
    finally:
        await proc.stop(timeout_s=10)
        await proc.aclose()


def config_file(
    tmp: Path,
    port: int,
    endpoints: list[str],
    *,
    auth: dict[str, Any] | None = None,
    protocols: tuple[str, ...] = ("TURN-UDP", "TURN-TCP"),
    tls_port: int | None = None,
    address: str = LOOPBACK,
) -> tuple[Path, int]:
    cert_b64 = key_b64 = ""
    if tls_port is not None:
        cert, key = self_signed_cert(tmp)
        cert_b64 = base64.b64encode(cert.read_bytes()).decode()
        key_b64 = base64.b64encode(key.read_bytes()).decode()
    listeners = []
    for proto in protocols:
        secure = proto in ("TURN-TLS", "TURN-DTLS")
        listener: dict[str, Any] = {
            "name": f"{proto.lower()}-listener",
            "protocol": proto,
            "address": address,
            "port": tls_port if secure else port,
            "routes": ["backend"],
        }
        if secure:
            listener |= {"cert": cert_b64, "key": key_b64}
        listeners.append(listener)
    config = {
        "version": "v1",
        "admin": {"name": "turncat-test/stunnerd", "loglevel": "all:INFO"},
        "auth": auth
        or {
            "type": "static",
            "realm": REALM,
            "credentials": {"username": USER, "password": PASSWORD},
        },
        "listeners": listeners,
        "clusters": [
            {"name": "backend", "type": "STATIC", "protocol": "UDP", "endpoints": endpoints}
        ],
    }
    path = tmp / "stunnerd.json"
    path.write_text(json.dumps(config))
    return path, len(listeners)


def uri(port: int, transport: str = "udp", user: str = USER, password: str = PASSWORD) -> str:
    return f"turn://{user}:{password}@{LOOPBACK}:{port}?transport={transport}"


def udp_local() -> str:
    return f"udp://{LOOPBACK}:{free_port(socket.SOCK_DGRAM)}"


async def roundtrips(local: str, messages: list[bytes]) -> list[bytes]:
    client = await udp_client(LOOPBACK, int(local.rsplit(":", 1)[1]))
    try:
        return [await client.roundtrip(m) for m in messages]
    finally:
        client.close()


async def test_turn_uri_mode_relays_many_udp_clients_each_on_its_own_allocation() -> None:
    port = free_udp_tcp_port()
    clients_n = 10
    async with stunnerd(uri(port)), udp_echo() as echo:
        local = udp_local()
        async with turncat(local, uri(port), echo.url) as tc:
            clients = [
                await udp_client(LOOPBACK, int(local.rsplit(":", 1)[1])) for _ in range(clients_n)
            ]
            try:
                replies = await asyncio.gather(
                    *(c.roundtrip(f"client {i}".encode()) for i, c in enumerate(clients))
                )
            finally:
                for c in clients:
                    c.close()
            assert replies == [f"client {i}".encode() for i in range(clients_n)]
            assert len(echo.protocol.sources) == clients_n
            assert await tc.stop() == 0


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_tcp_local_clients_through_stunnerd(transport: str) -> None:
    port = free_udp_tcp_port()
    local_port = free_port()
    async with (
        stunnerd(uri(port, transport)),
        udp_echo() as echo,
        turncat(f"tcp://{LOOPBACK}:{local_port}", uri(port, transport), echo.url) as tc,
    ):
        conns = [await asyncio.open_connection(LOOPBACK, local_port) for _ in range(3)]
        try:
            for i, (reader, writer) in enumerate(conns):
                msg = f"stream {i}".encode()
                writer.write(msg)
                await writer.drain()
                async with asyncio.timeout(5):
                    assert await reader.readexactly(len(msg)) == msg
        finally:
            for _, writer in conns:
                writer.close()
                await writer.wait_closed()
        assert len(echo.protocol.sources) == 3
        assert await tc.stop() == 0


async def test_stdin_mode_through_stunnerd() -> None:
    port = free_udp_tcp_port()
    async with stunnerd(uri(port)), udp_echo() as echo:
        tc = await start_turncat("-", uri(port), echo.url, stdin=asyncio.subprocess.PIPE)
        try:
            assert tc.proc.stdin is not None
            assert tc.proc.stdout is not None
            for line in (b"first line\n", b"second line\n"):
                tc.proc.stdin.write(line)
                await tc.proc.stdin.drain()
                async with asyncio.timeout(10):
                    assert await tc.proc.stdout.readline() == line
            tc.proc.stdin.close()
            assert await tc.wait() == 0, tc.stderr
        finally:
            await tc.aclose()


async def test_peer_outside_every_cluster_is_forbidden_with_exit_code_4(tmp_path: Path) -> None:
    port = free_udp_tcp_port()
    path, n = config_file(tmp_path, port, ["10.99.0.0/16"])
    async with stunnerd("-c", str(path), listeners=n), udp_echo() as echo:
        for transport in ("udp", "tcp"):
            rc, err = await run_turncat(udp_local(), uri(port, transport), echo.url)
            assert rc == 4, err
            last = err.strip().splitlines()[-1]
            assert last.startswith("turncat: peer 127.0.0.1:")
            assert "not allowed" in last
            assert "403" in last
        assert echo.protocol.received == 0


async def test_peer_on_an_admitted_ip_but_a_port_outside_the_range_exits_4(
    tmp_path: Path,
) -> None:
    port = free_udp_tcp_port()
    async with udp_echo() as echo:
        other = echo.port + 1 if echo.port < 65535 else echo.port - 1
        path, n = config_file(tmp_path, port, [f"127.0.0.1/32:<{other}-{other}>"])
        async with stunnerd("-c", str(path), listeners=n):
            for transport in ("udp", "tcp"):
                rc, err = await run_turncat(udp_local(), uri(port, transport), echo.url)
                assert rc == 4, err
                last = err.strip().splitlines()[-1]
                assert last.startswith("turncat: peer 127.0.0.1:")
                assert "403" in last
        assert echo.protocol.received == 0


async def test_peer_admitted_by_a_port_range_cluster_is_relayed(tmp_path: Path) -> None:
    port = free_udp_tcp_port()
    async with udp_echo() as echo:
        admit = [f"127.0.0.1/32:<{echo.port}-{echo.port}>"]
        path, n = config_file(tmp_path, port, admit)
        async with stunnerd("-c", str(path), listeners=n):
            for transport in ("udp", "tcp"):
                local = udp_local()
                async with turncat(local, uri(port, transport), echo.url) as tc:
                    assert await roundtrips(local, [b"a", b"b"]) == [b"a", b"b"]
                    assert await tc.stop() == 0


async def test_ephemeral_auth_with_stunnerd(tmp_path: Path) -> None:
    port = free_udp_tcp_port()
    auth = {"type": "ephemeral", "realm": REALM, "credentials": {"secret": SECRET}}
    path, n = config_file(tmp_path, port, ["127.0.0.1/32"], auth=auth)
    user, password = ephemeral_credentials(SECRET, ttl_s=600, now=time.time())
    from urllib.parse import quote

    async with stunnerd("-c", str(path), listeners=n), udp_echo() as echo:
        local = udp_local()
        async with turncat(local, uri(port, "udp", user, quote(password, safe="")), echo.url) as tc:
            assert await roundtrips(local, [b"ephemeral"]) == [b"ephemeral"]
            assert await tc.stop() == 0
        expired_user, expired_pw = ephemeral_credentials(SECRET, ttl_s=-60, now=time.time())
        rc, err = await run_turncat(
            udp_local(), uri(port, "udp", expired_user, quote(expired_pw, safe="")), echo.url
        )
        assert rc == 3, err


async def test_wrong_password_against_stunnerd_exits_with_code_3() -> None:
    port = free_udp_tcp_port()
    async with stunnerd(uri(port)), udp_echo() as echo:
        rc, err = await run_turncat(udp_local(), uri(port, "udp", USER, "nope"), echo.url)
    assert rc == 3, err
    assert err.strip().splitlines()[-1].startswith("turncat: authentication failed")


@pytest.mark.parametrize("transport", ["tls", "dtls"])
async def test_tls_and_dtls_listeners_of_stunnerd(tmp_path: Path, transport: str) -> None:
    port, tls_port = free_udp_tcp_port(), free_udp_tcp_port()
    proto = "TURN-TLS" if transport == "tls" else "TURN-DTLS"
    path, n = config_file(tmp_path, port, ["127.0.0.1/32"], protocols=(proto,), tls_port=tls_port)
    async with stunnerd("-c", str(path), listeners=n), udp_echo() as echo:
        local = udp_local()
        ca = str(tmp_path / "cert.pem")
        async with turncat(local, uri(tls_port, transport), echo.url, "--ca", ca) as tc:
            assert await roundtrips(local, [b"secure 1", b"secure 2"]) == [b"secure 1", b"secure 2"]
            assert await tc.stop() == 0


async def test_stunnerd_with_worker_processes_refuses_tcp_relays_with_exit_code_6(
    tmp_path: Path,
) -> None:
    # RFC 6062 relays are served by a single stunnerd process; its workers answer 442.
    port = free_udp_tcp_port()
    path, n = config_file(tmp_path, port, ["127.0.0.1/32"])
    async with (
        stunnerd("-c", str(path), "--udp-thread-num", "2", listeners=n),
        tcp_echo() as echo,
    ):
        rc, err = await run_turncat("-", uri(port, "tcp"), echo.url)
    assert rc == 6, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("turncat: the TURN server does not offer a TCP relay (RFC 6062)")
    assert "442" in last
    assert echo.connections == 0


@needs_ipv6
@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_ipv6_server_and_ipv6_peer_through_stunnerd(tmp_path: Path, transport: str) -> None:
    port = free_udp_tcp_port("::1")
    path, n = config_file(tmp_path, port, ["::1/128"], address="::1")
    server = f"turn://{USER}:{PASSWORD}@[::1]:{port}?transport={transport}"
    async with (
        stunnerd("-c", str(path), listeners=n, bind="::1"),
        udp_echo("::1") as echo,
    ):
        reply, rc, err = await stdin_roundtrip(server, echo.url, b"v6 all the way\n")
    assert (reply, rc) == (b"v6 all the way\n", 0), err
    assert {host for host, _ in echo.protocol.sources} == {"::1"}


@needs_ipv6
async def test_ipv6_peer_through_a_listener_without_ipv6_relays_exits_6_with_440(
    tmp_path: Path,
) -> None:
    port = free_udp_tcp_port()
    path, n = config_file(tmp_path, port, ["::1/128", "127.0.0.1/32"])
    async with stunnerd("-c", str(path), listeners=n), udp_echo("::1") as echo:
        _reply, rc, err = await stdin_roundtrip(uri(port), echo.url, b"nowhere\n")
    assert rc == 6, err
    last = err.strip().splitlines()[-1]
    assert last == (
        "turncat: the TURN server does not offer an IPv6 relay: "
        "ALLOCATE failed with 440 Address Family not Supported"
    )
    assert echo.protocol.received == 0


@pytest.mark.parametrize("transport", ["tcp", "tls"])
async def test_tcp_peer_through_stunnerd_one_connection_per_client(
    tmp_path: Path, transport: str
) -> None:
    port, tls_port = free_udp_tcp_port(), free_udp_tcp_port()
    protocols = ("TURN-TCP", "TURN-TLS")
    path, n = config_file(tmp_path, port, ["127.0.0.1/32"], protocols=protocols, tls_port=tls_port)
    local_port = free_port()
    server = uri(tls_port if transport == "tls" else port, transport)
    async with (
        stunnerd("-c", str(path), listeners=n),
        tcp_echo() as echo,
        turncat(f"tcp://{LOOPBACK}:{local_port}", server, echo.url, "--insecure"),
    ):
        assert echo.connections == 1  # the startup check
        big = os.urandom(200_000)
        replies = await asyncio.gather(
            *(
                tcp_roundtrip(local_port, payload)
                for payload in (b"first client", b"second client", big)
            )
        )
        assert list(replies) == [b"first client", b"second client", big]
        assert echo.connections == 4
        assert len(set(echo.sources)) == 4  # each from its own relayed address


async def test_tcp_peer_through_stunnerd_from_stdin() -> None:
    port = free_udp_tcp_port()
    async with stunnerd(uri(port, "tcp")), tcp_echo() as echo:
        line = b"a line for a tcp peer\n"
        reply, rc, err = await stdin_roundtrip(uri(port, "tcp"), echo.url, line)
    assert (reply, rc) == (line, 0), err
    assert echo.connections == 1  # stdin mode opens its one session, no separate check


async def test_tcp_peer_refusals_of_stunnerd_have_their_exit_codes(tmp_path: Path) -> None:
    port = free_udp_tcp_port()
    path, n = config_file(tmp_path, port, ["127.0.0.1/32"], protocols=("TURN-TCP",))
    async with stunnerd("-c", str(path), listeners=n):
        # Admitted by the route, but nobody listens there: 447.
        closed = free_port()
        rc, err = await run_turncat("-", uri(port, "tcp"), f"tcp://{LOOPBACK}:{closed}")
        assert rc == 7, err
        assert "447" in err.strip().splitlines()[-1]
        # Outside every cluster: 403.
        rc, err = await run_turncat("-", uri(port, "tcp"), "tcp://127.0.0.2:80")
        assert rc == 4, err
        assert "not allowed" in err.strip().splitlines()[-1]


@needs_ipv6
async def test_ipv6_peer_through_an_ipv4_listener_asks_for_an_ipv6_relay(tmp_path: Path) -> None:
    # The listener is IPv4; only REQUESTED-ADDRESS-FAMILY gets the allocation its IPv6 relay.
    port = free_udp_tcp_port()
    path, n = config_file(tmp_path, port, ["::1/128", "127.0.0.1/32"])
    env = {"STUNNERD_RELAY_ADDRESSES": "::1"}
    async with stunnerd("-c", str(path), listeners=n, env=env), udp_echo("::1") as echo:
        reply, rc, err = await stdin_roundtrip(uri(port), echo.url, b"to v6 via v4\n")
    assert (reply, rc) == (b"to v6 via v4\n", 0), err
    assert {host for host, _ in echo.protocol.sources} == {"::1"}
