"""What one client may hold at the CDS: open watches per IP and the messages it sends on one.

The attacker connects from 127.0.0.2, each honest watcher from an address of its own in
127.0.1.0/24: the attacker at 10x a limit is refused with the documented code, and every honest
watcher is still served.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from stunner_common.config import parse_config
from stunner_common.io.store import ConfigPublisher
from support.cds import FRAME_TIMEOUT_S, RunningCds, config, http_get, recv_text, running_cds
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration

WATCHERS_PER_CLIENT = 4
HONEST = 20
HTTP_CONNECTIONS_PER_CLIENT = 4
ATTACKER = ("127.0.0.2", 0)


def honest_addr(i: int) -> tuple[str, int]:
    return (f"127.0.1.{i + 1}", 0)


@pytest.fixture
async def cds(no_leaked_tasks: None, redis: RedisServer) -> AsyncIterator[RunningCds]:
    async with running_cds(
        redis.url,
        max_watchers_per_client=WATCHERS_PER_CLIENT,
        max_http_connections_per_client=HTTP_CONNECTIONS_PER_CLIENT,
        ws_max_messages_per_s=5.0,
        ws_message_burst=10,
    ) as running:
        yield running


async def all_served(publisher: ConfigPublisher, honest: list[ClientConnection], n: int) -> None:
    """A config change reaches every honest watcher."""
    await publisher.upsert(f"ns/gw{n}", parse_config(config(f"ns/gw{n}")))
    for ws in honest:
        for _ in range(n):  # a new watcher gets the configs before this one first
            if f"ns/gw{n}" in await recv_text(ws):
                break
        else:
            raise AssertionError(f"ns/gw{n} never reached a watcher")


async def flood(ws: ClientConnection, messages: int) -> None:
    async with asyncio.timeout(FRAME_TIMEOUT_S):
        for _ in range(messages):
            await ws.send("x")
        while True:
            await ws.recv()


async def metric(cds: RunningCds, name: str) -> float:
    text = (await http_get(cds, "/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def test_watches_past_the_per_client_limit_get_429_and_honest_watchers_are_served(
    cds: RunningCds, publisher: ConfigPublisher
) -> None:
    url = f"{cds.ws_url}/api/v1/configs?watch=true"
    async with contextlib.AsyncExitStack() as stack:
        held: list[ClientConnection] = []
        refused: list[int] = []
        for _ in range(10 * WATCHERS_PER_CLIENT):
            try:
                held.append(await stack.enter_async_context(connect(url, local_addr=ATTACKER)))
            except InvalidStatus as exc:
                refused.append(exc.response.status_code)
        assert len(held) == WATCHERS_PER_CLIENT
        assert refused == [429] * (9 * WATCHERS_PER_CLIENT)
        honest = [
            await stack.enter_async_context(connect(url, local_addr=honest_addr(i)))
            for i in range(HONEST)
        ]
        await all_served(publisher, honest, 1)
        assert await metric(cds, 'stunner_cds_refusals_total{limit="watchers_per_client"}') == (
            9 * WATCHERS_PER_CLIENT
        )
    # once the attacker's watches close, it may watch again
    async with connect(url, local_addr=ATTACKER) as ws:
        await all_served(publisher, [ws], 2)


async def test_a_watcher_sending_ten_times_its_burst_is_closed_with_1008(
    cds: RunningCds, publisher: ConfigPublisher
) -> None:
    url = f"{cds.ws_url}/api/v1/configs?watch=true"
    async with contextlib.AsyncExitStack() as stack:
        honest = [
            await stack.enter_async_context(connect(url, local_addr=honest_addr(i)))
            for i in range(HONEST)
        ]
        async with connect(url, local_addr=ATTACKER) as attacker:
            with pytest.raises(ConnectionClosed) as closed:
                await flood(attacker, 100)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1008
        await all_served(publisher, honest, 1)
    assert await metric(cds, 'stunner_cds_watchers_dropped_total{reason="message_rate"}') == 1


async def test_http_connections_past_the_per_client_cap_get_429_and_watches_do_not_count(
    cds: RunningCds, publisher: ConfigPublisher
) -> None:
    url = f"{cds.ws_url}/api/v1/configs?watch=true"
    attempts = 10 * HTTP_CONNECTIONS_PER_CLIENT
    refused = attempts - HTTP_CONNECTIONS_PER_CLIENT
    name = 'stunner_cds_refusals_total{limit="connections_per_client"}'
    async with contextlib.AsyncExitStack() as stack:
        # an upgraded watch leaves the HTTP count: the attacker's watches do not use its slots
        watches = [
            await stack.enter_async_context(connect(url, local_addr=ATTACKER))
            for _ in range(WATCHERS_PER_CLIENT)
        ]
        conns = [
            await asyncio.open_connection("127.0.0.1", cds.port, local_addr=ATTACKER)
            for _ in range(attempts)
        ]
        try:
            for _ in range(int(FRAME_TIMEOUT_S / 0.02)):
                if await metric(cds, name) >= refused:
                    break
                await asyncio.sleep(0.02)
            honest = [
                await stack.enter_async_context(connect(url, local_addr=honest_addr(i)))
                for i in range(HONEST)
            ]
            await all_served(publisher, honest + watches, 1)
            for _, writer in conns:
                with contextlib.suppress(ConnectionError):
                    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            async with asyncio.timeout(FRAME_TIMEOUT_S):
                answers = await asyncio.gather(*(reader.read(-1) for reader, _ in conns))
        finally:
            for _, writer in conns:
                writer.close()
    statuses = sorted(int(answer.split(b" ", 2)[1]) for answer in answers)
    assert statuses == [200] * HTTP_CONNECTIONS_PER_CLIENT + [429] * refused
    assert await metric(cds, name) == refused
