"""The shared test support starts and stops real servers."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from support import ports as ports_module
from support.leaks import assert_no_leaked_tasks
from support.node_call import EchoCall
from support.ports import free_port, free_udp_tcp_port
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration


async def test_redis_fixture_is_a_real_server_that_keeps_data_across_restart(
    redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(redis.url)
    await client.set("k", "v")
    await client.aclose()
    pid = redis.proc.pid if redis.proc else 0
    redis.restart()
    assert redis.proc is not None
    assert redis.proc.pid != pid
    client = aioredis.Redis.from_url(redis.url)
    assert await client.get("k") == b"v"
    await client.aclose()


def test_redis_server_is_gone_after_stop(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    port = server.port
    server.stop()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_free_ports_are_bindable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
    port = free_udp_tcp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", port))
    with socket.socket() as tcp:
        tcp.bind(("127.0.0.1", port))


def test_free_ports_stay_out_of_the_kernels_ephemeral_range() -> None:
    # A port handed to a server's command line must not be one the kernel may give any socket
    # bound to port 0 (or any outgoing connection) before the server binds it.
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(50)} | {free_udp_tcp_port() for _ in range(50)}
    assert len(ports) == 100
    if low > ports_module.HANDED_OUT.start + 64:
        assert all(ports_module.HANDED_OUT.start <= p < min(low, 30000) for p in ports), ports


def test_each_xdist_worker_draws_its_own_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = []
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    for i in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        slices.append(set(ports_module._worker_slice()))
    for i, one in enumerate(slices):
        assert one
        for other in slices[i + 1 :]:
            assert not one & other


async def test_leak_check_reports_a_task_left_running() -> None:
    before = set(asyncio.all_tasks())
    task = asyncio.create_task(asyncio.sleep(30), name="forgotten")
    with pytest.raises(AssertionError, match="forgotten"):
        await assert_no_leaked_tasks(before, grace_s=0.05)
    assert task.cancelled() or task.cancelling()
    await asyncio.gather(task, return_exceptions=True)


async def test_leak_check_passes_when_tasks_finish(no_leaked_tasks: None) -> None:
    await asyncio.create_task(asyncio.sleep(0))


async def test_a_settled_call_report_does_not_count_datagrams_in_flight_as_lost() -> None:
    # The node tier's calls (support.node_call) are read while they run: a datagram sent just
    # before the read is still on its way back, and must not count as lost.
    loop = asyncio.get_running_loop()

    class SlowEcho(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            loop.call_later(0.1, self.transport.sendto, data, addr)  # type: ignore[attr-defined]

    echo, _ = await loop.create_datagram_endpoint(SlowEcho, local_addr=("127.0.0.1", 0))
    call = EchoCall(echo.get_extra_info("sockname")[1], interval_s=0.02)
    try:
        await call.start()
        await asyncio.sleep(0.3)
        assert call.report().lost > 0  # read at once: what is still on its way counts
        settled = await call.settled(call.whole())
        assert settled.sent > 0
        assert settled.lost == 0, settled
    finally:
        await call.stop(drain_s=0.0)
        echo.close()
