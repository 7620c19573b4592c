"""What one client may make the auth service hold: head time, query, body, head and connections.

The attacker connects from 127.0.0.2 at 10x a limit, each honest client from an address of its
own in 127.0.1.0/24: the attacker gets the documented code (counted in
``stunner_auth_refusals{limit}``) and every honest request is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from support.auth import POLL_S, RunningAuth, running_auth
from support.ports import free_port

pytestmark = pytest.mark.integration

HONEST = 20
ATTACKER = "127.0.0.2"
CONNECTIONS_PER_CLIENT = 4
TIMEOUT_S = 10.0
LIMITS = {
    "max_header_bytes": 4096,
    "max_query_bytes": 256,
    "max_body_bytes": 1024,
    "request_head_timeout_s": 0.5,
    "max_connections_per_client": CONNECTIONS_PER_CLIENT,
}


@pytest.fixture
async def auth(no_leaked_tasks: None) -> AsyncIterator[RunningAuth]:
    # No CDS: the limits hold before any route runs, and /healthz answers without configs.
    async with running_auth(f"127.0.0.1:{free_port()}", ready=False, **LIMITS) as running:
        yield running


@contextlib.asynccontextmanager
async def raw(
    auth: RunningAuth, source: str = ATTACKER
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", auth.port, local_addr=(source, 0))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def status_of(reader: asyncio.StreamReader) -> int:
    """The status of the one response the server sends before it closes."""
    async with asyncio.timeout(TIMEOUT_S):
        data = await reader.read(-1)
    return int(data.split(b" ", 2)[1])


async def honest_requests_succeed(auth: RunningAuth) -> None:
    async def one(i: int) -> int:
        transport = httpx.AsyncHTTPTransport(local_address=f"127.0.1.{i + 1}")
        async with httpx.AsyncClient(base_url=auth.url, transport=transport) as http:
            return (await http.get("/healthz", params={"probe": "x" * 200})).status_code

    assert await asyncio.gather(*(one(i) for i in range(HONEST))) == [200] * HONEST


async def refusals(auth: RunningAuth, limit: str) -> float:
    async with httpx.AsyncClient(base_url=auth.url) as http:
        text = (await http.get("/metrics")).text
    name = f'stunner_auth_refusals_total{{limit="{limit}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def eventually_refused(auth: RunningAuth, count: int) -> None:
    """Poll /metrics (bounded) until ``count`` connections were refused."""
    for _ in range(int(TIMEOUT_S / POLL_S)):
        if await refusals(auth, "connections_per_client") >= count:
            return
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"fewer than {count} connections were refused")


@pytest.mark.parametrize(
    ("request_bytes", "code", "limit"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", 408, "request_head_timeout"),
        (
            b"GET /?service=turn&username=" + b"u" * 2560 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            414,
            "query_bytes",
        ),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10240\r\n\r\n", 413, "body_bytes"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 40960 + b"\r\n\r\n", 431, "header_bytes"),
    ],
    ids=["head-deadline", "query", "body", "head-size"],
)
async def test_a_request_ten_times_a_limit_gets_its_code_and_honest_clients_are_served(
    auth: RunningAuth, request_bytes: bytes, code: int, limit: str
) -> None:
    async with raw(auth) as (reader, writer):
        with contextlib.suppress(ConnectionError):
            writer.write(request_bytes)
        answer = asyncio.create_task(status_of(reader))
        await honest_requests_succeed(auth)
        assert await answer == code
    assert await refusals(auth, limit) == 1


async def test_connections_past_the_per_client_cap_get_429_and_honest_clients_are_served(
    no_leaked_tasks: None,
) -> None:
    limits = LIMITS | {"request_head_timeout_s": TIMEOUT_S}
    async with running_auth(f"127.0.0.1:{free_port()}", ready=False, **limits) as auth:
        await attacker_at_ten_times_the_connection_cap(auth)


async def attacker_at_ten_times_the_connection_cap(auth: RunningAuth) -> None:
    attempts = 10 * CONNECTIONS_PER_CLIENT
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(raw(auth)) for _ in range(attempts)]
        await eventually_refused(auth, attempts - CONNECTIONS_PER_CLIENT)
        await honest_requests_succeed(auth)
        for _, writer in conns:
            with contextlib.suppress(ConnectionError):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        statuses = await asyncio.gather(*(status_of(reader) for reader, _ in conns))
    assert sorted(statuses) == [200] * CONNECTIONS_PER_CLIENT + [429] * (
        attempts - CONNECTIONS_PER_CLIENT
    )
    assert await refusals(auth, "connections_per_client") == attempts - CONNECTIONS_PER_CLIENT
    # once its connections close, the attacker's address is served again
    async with raw(auth) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert await status_of(reader) == 200
