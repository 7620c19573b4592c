"""`k8s://namespace/gateway:listener` resolved through a real CDS (stunner-cds on a real Redis).

The config the operator would render is published with the shared `ConfigPublisher`; the CDS
serves it; turncat reads the listener's public address and the auth section from it and relays
through coturn, which stands in for the dataplane here.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from stunner_common.config import parse_config
from stunner_common.io.store import ConfigPublisher
from support.echo import udp_echo
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, wait_for_tcp
from support.redis_server import RedisServer
from support.turncat_harness import (
    PASSWORD,
    REALM,
    SECRET,
    USER,
    Coturn,
    coturn,
    run_turncat,
    turncat,
    udp_client,
)

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(90)]

GATEWAY_ID = "stunner/udp-gateway"
READY_TIMEOUT_S = 15.0
POLL_S = 0.05


def gateway_config(server: Coturn, auth: dict[str, Any], *, public: bool = True) -> dict[str, Any]:
    listener: dict[str, Any] = {
        "name": f"{GATEWAY_ID}/udp-listener",
        "protocol": "TURN-UDP",
        "address": LOOPBACK,
        "port": server.port,
        "routes": ["stunner/echo"],
    }
    if public:
        listener |= {"public_address": LOOPBACK, "public_port": server.port}
    return {
        "version": "v1",
        "admin": {"name": GATEWAY_ID},
        "auth": {"realm": REALM, **auth},
        "listeners": [listener],
        "clusters": [
            {
                "name": "stunner/echo",
                "type": "STATIC",
                "protocol": "UDP",
                "endpoints": ["127.0.0.1/32"],
            }
        ],
    }


@contextlib.contextmanager
def cds_process(redis_url: str, tmp: Path) -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "stunner_cds",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--redis-url",
        redis_url,
    ]
    proc = ServerProcess(argv, log_path=tmp / "cds.log")
    try:
        wait_for_tcp(LOOPBACK, port, timeout_s=READY_TIMEOUT_S, proc=proc)
        yield f"{LOOPBACK}:{port}"
    finally:
        proc.stop()


@contextlib.asynccontextmanager
async def published(redis: RedisServer, config: dict[str, Any]) -> AsyncIterator[None]:
    client = aioredis.from_url(redis.url)
    try:
        await ConfigPublisher(client).upsert(GATEWAY_ID, parse_config(config))
        yield
    finally:
        await client.aclose()


async def wait_served(cds_addr: str) -> None:
    """Poll (bounded) until the CDS serves the published gateway."""
    url = f"http://{cds_addr}/api/v1/configs/{GATEWAY_ID}"
    async with httpx.AsyncClient(timeout=2) as http, asyncio.timeout(READY_TIMEOUT_S):
        for _ in range(int(READY_TIMEOUT_S / POLL_S)):
            if (await http.get(url)).status_code == 200:
                return
            await asyncio.sleep(POLL_S)
    raise TimeoutError(f"the CDS never served {GATEWAY_ID}")


def _udp_local() -> str:
    return f"udp://{LOOPBACK}:{free_port(socket.SOCK_DGRAM)}"


@pytest.mark.parametrize(
    ("auth", "secret"),
    [
        ({"type": "static", "credentials": {"username": USER, "password": PASSWORD}}, None),
        ({"type": "ephemeral", "credentials": {"secret": SECRET}}, SECRET),
    ],
    ids=["static", "ephemeral"],
)
async def test_k8s_uri_resolves_listener_and_credentials_through_the_cds(
    tmp_path: Path, redis: RedisServer, auth: dict[str, Any], secret: str | None
) -> None:
    with coturn(tmp_path, secret=secret) as server, cds_process(redis.url, tmp_path) as cds:
        async with published(redis, gateway_config(server, auth)), udp_echo() as echo:
            await wait_served(cds)
            local = _udp_local()
            uri = f"k8s://{GATEWAY_ID}:udp-listener"
            async with turncat(local, uri, echo.url, "--cds-server-address", cds) as tc:
                client = await udp_client(LOOPBACK, int(local.rsplit(":", 1)[1]))
                try:
                    assert await client.roundtrip(b"via k8s") == b"via k8s"
                finally:
                    client.close()
                assert await tc.stop() == 0
    if secret:
        # turncat minted TURN REST usernames (expiry timestamps), not a static user.
        assert re.search(r"username=<\d{10}>", server.proc.output())
        assert f"username=<{USER}>" not in server.proc.output()


async def test_k8s_uri_takes_the_cds_address_from_the_environment(
    tmp_path: Path, redis: RedisServer
) -> None:
    auth = {"type": "static", "credentials": {"username": USER, "password": PASSWORD}}
    with coturn(tmp_path) as server, cds_process(redis.url, tmp_path) as cds:
        async with published(redis, gateway_config(server, auth)), udp_echo() as echo:
            await wait_served(cds)
            local = _udp_local()
            # CDS_SERVER_ADDR, as for the auth service and stunnerctl (upstream's name); the old
            # STUNNER_CDS_ADDR still works, with a deprecation warning.
            for env in ({"CDS_SERVER_ADDR": cds}, {"STUNNER_CDS_ADDR": cds}):
                async with turncat(
                    local, "k8s:///udp-gateway:udp-listener", echo.url, "-n", "stunner", env=env
                ) as tc:
                    client = await udp_client(LOOPBACK, int(local.rsplit(":", 1)[1]))
                    try:
                        assert await client.roundtrip(b"env") == b"env"
                    finally:
                        client.close()
                    assert await tc.stop() == 0


async def test_k8s_lookup_errors_are_clear_and_exit_with_their_codes(
    tmp_path: Path, redis: RedisServer
) -> None:
    auth = {"type": "static", "credentials": {"username": USER, "password": PASSWORD}}
    with coturn(tmp_path) as server, cds_process(redis.url, tmp_path) as cds:
        async with published(redis, gateway_config(server, auth)), udp_echo() as echo:
            await wait_served(cds)
            local = _udp_local()
            cases = [
                (
                    "k8s://stunner/udp-gateway:no-such-listener",
                    ["--cds-server-address", cds],
                    2,
                    "has no listener 'no-such-listener'",
                ),
                (
                    "k8s://stunner/no-such-gateway:udp-listener",
                    ["--cds-server-address", cds],
                    2,
                    "no config for gateway stunner/no-such-gateway",
                ),
                (
                    "k8s://stunner/udp-gateway:udp-listener",
                    ["--cds-server-address", f"{LOOPBACK}:{free_port()}"],
                    5,
                    "cannot reach the CDS",
                ),
            ]
            for uri, flags, code, text in cases:
                rc, err = await run_turncat(
                    local, uri, echo.url, *flags, env={"CDS_SERVER_ADDR": ""}
                )
                assert rc == code, (uri, err)
                assert text in err.strip().splitlines()[-1], err
            # No address at all: the default every tool shares, 127.0.0.1:13478.
            rc, err = await run_turncat(
                local, "k8s://stunner/udp-gateway:udp-listener", echo.url, env={}
            )
            assert rc != 0
            assert "the CDS at http://127.0.0.1:13478" in err, err


async def test_k8s_listener_without_public_address_is_reported(
    tmp_path: Path, redis: RedisServer
) -> None:
    auth = {"type": "static", "credentials": {"username": USER, "password": PASSWORD}}
    with coturn(tmp_path) as server, cds_process(redis.url, tmp_path) as cds:
        config = gateway_config(server, auth, public=False)
        async with published(redis, config), udp_echo() as echo:
            await wait_served(cds)
            rc, err = await run_turncat(
                _udp_local(),
                f"k8s://{GATEWAY_ID}:udp-listener",
                echo.url,
                "--cds-server-address",
                cds,
            )
    assert rc == 2, err
    assert "no public address/port" in err
