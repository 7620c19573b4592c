"""Packet and byte counters, scraped over HTTP after a known number of datagrams were relayed.

A real aioice client relays numbered payloads through stunnerd to a UDP echo peer (ChannelData
both ways), then `/metrics` and `/status` must show exactly that many datagrams and bytes for the
cluster, at least that many on the listener, and the same figures in both documents. Traffic to a
peer that no route admits must leave no cluster series at all. With two worker processes the
allocations are spread until each worker holds one, so the figures are sums over workers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.echo import UdpEcho
from support.stunnerd_process import (
    STEP_TIMEOUT_S,
    EchoAllocation,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = pytest.mark.integration

PAYLOAD_BYTES = 100
PER_ALLOCATION = 25
MAX_CLIENTS = 40


def samples(scrape: str, metric: str) -> dict[tuple[str, str], float]:
    """{(name label, direction label): value} of one counter family."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            if sample.name == metric:
                out[(sample.labels["name"], sample.labels["direction"])] = sample.value
    return out


async def relay_exactly(alloc: EchoAllocation, count: int, tag: str) -> None:
    """Send `count` payloads of PAYLOAD_BYTES one at a time, each waited for on its way back."""
    for i in range(count):
        payload = f"{tag}-{i}-".encode().ljust(PAYLOAD_BYTES, b"x")
        alloc.transport.sendto(payload, alloc.peer)
        async with asyncio.timeout(STEP_TIMEOUT_S):
            while (await alloc.receiver.received.get()) != payload:
                pass


def metrics_config(ports: dict[str, int], metrics: int, cluster: str) -> dict[str, Any]:
    config = base_config(health_port(), ports, peer_cluster=cluster)
    config["admin"]["metrics_endpoint"] = f"http://127.0.0.1:{metrics}/metrics"
    return config


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
async def test_relayed_datagrams_are_counted_exactly_per_cluster_and_summed_over_workers(
    tmp_path: Path, echo: UdpEcho, workers: int
) -> None:
    ports = listener_ports("a")
    metrics = health_port()
    args = ("--udp-thread-num", "2") if workers == 2 else ()
    server = ManagedStunnerd(tmp_path, metrics_config(ports, metrics, "echo"), *args)
    allocations: list[EchoAllocation] = []
    try:
        status = await server.ready()
        peer = (echo.host, echo.port)
        for _ in range(MAX_CLIENTS if workers == 2 else 1):
            allocations.append(await EchoAllocation.open(ports["a"], peer))
            status = await server.status()
            if all(w["allocations"] > 0 for w in status.get("workers", ())):
                break
        assert all(w["allocations"] > 0 for w in status.get("workers", ())), status["workers"]
        for n, alloc in enumerate(allocations):
            await relay_exactly(alloc, PER_ALLOCATION, f"a{n}")
        sent = PER_ALLOCATION * len(allocations)

        scrape = (await server.get("/metrics", metrics)).text
        status = await server.status()
        packets = samples(scrape, "stunner_cluster_packets_total")
        octets = samples(scrape, "stunner_cluster_bytes_total")
        assert packets == {("echo", "tx"): sent, ("echo", "rx"): sent}
        volume = sent * PAYLOAD_BYTES
        assert octets == {("echo", "tx"): volume, ("echo", "rx"): volume}
        cluster = next(c for c in status["clusters"] if c["name"] == "echo")
        assert cluster["stats"]["tx"] == {"pkts": sent, "bytes": sent * PAYLOAD_BYTES}
        assert cluster["stats"]["rx"] == {"pkts": sent, "bytes": sent * PAYLOAD_BYTES}
        idle = next(c for c in status["clusters"] if c["name"] == "elsewhere")
        assert idle["stats"]["tx"]["pkts"] == idle["stats"]["rx"]["pkts"] == 0

        l_packets = samples(scrape, "stunner_listener_packets_total")
        l_bytes = samples(scrape, "stunner_listener_bytes_total")
        # Every relayed datagram crossed the listener socket once each way as ChannelData (a
        # 4-byte header), on top of the Allocate/ChannelBind/Refresh exchanges.
        assert l_packets[("a", "rx")] > sent
        assert l_packets[("a", "tx")] > sent
        assert l_bytes[("a", "rx")] > sent * (PAYLOAD_BYTES + 4)
        assert l_bytes[("a", "tx")] > sent * (PAYLOAD_BYTES + 4)
        listener = status["listeners"][0]["stats"]
        # /status was refreshed after the scrape, so it can only have grown (by our requests)
        assert listener["rx"]["pkts"] >= l_packets[("a", "rx")]
        assert listener["tx"]["pkts"] >= l_packets[("a", "tx")]
    finally:
        for alloc in allocations:
            await alloc.close()
        await server.close()


async def test_traffic_no_route_admits_produces_no_cluster_series(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("a")
    metrics = health_port()
    server = ManagedStunnerd(tmp_path, metrics_config(ports, metrics, "elsewhere"))
    alloc: EchoAllocation | None = None
    try:
        await server.ready()
        alloc = await EchoAllocation.open(ports["a"], (echo.host, echo.port))
        assert not await alloc.echoes(wait_s=0.6)  # ChannelBind gets 403; nothing is relayed
        scrape = (await server.get("/metrics", metrics)).text
        assert samples(scrape, "stunner_cluster_packets_total") == {}
        assert samples(scrape, "stunner_cluster_bytes_total") == {}
        assert samples(scrape, "stunner_listener_packets_total")[("a", "rx")] > 0
        assert echo.protocol.received == 0
    finally:
        if alloc is not None:
            await alloc.close()
        await server.close()
