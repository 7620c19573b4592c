"""stunnerd in watch mode against the real CDS: bootstrap, deltas, a CDS outage, deletes.

The operator's side is played by the shared Redis publisher, exactly as the operator writes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from stunner_common.io.store import ConfigPublisher
from support.cds_server import CdsServer
from support.echo import UdpEcho
from support.stunnerd_process import (
    EchoAllocation,
    ManagedStunnerd,
    base_config,
    health_port,
    listener_ports,
)

pytestmark = pytest.mark.integration

ID = "stunner/udp-gateway"


def rendered(port: int) -> dict[str, Any]:
    cfg = base_config(8086, {"udp": port})
    cfg["admin"]["name"] = ID
    cfg["listeners"][0]["address"] = "$STUNNER_ADDR"
    return cfg


async def test_a_watching_stunnerd_follows_the_cds_and_rides_out_its_outage(
    tmp_path: Path, cds: CdsServer, publisher: ConfigPublisher, echo: UdpEcho
) -> None:
    port = listener_ports("udp")["udp"]
    server = ManagedStunnerd(
        tmp_path,
        None,
        "-w",
        "--id",
        ID,
        origin=cds.url,
        health=health_port(),
        env={"STUNNER_ADDR": "127.0.0.1"},
    )
    try:
        status = await server.wait_status(lambda s: s["status"] == "NOT-READY", "bootstrap")
        assert (await server.get("/ready")).status_code == 503
        assert (await server.get("/live")).status_code == 200
        assert "listeners" not in status

        config = rendered(port)
        await publisher.upsert(ID, config)
        first = await server.ready()
        assert first["listeners"][0]["address"] == "127.0.0.1"
        assert first["revision"] is not None
        alloc = await EchoAllocation.open(port, (echo.host, echo.port))
        assert await alloc.echoes()

        update = copy.deepcopy(config)
        update["auth"]["credentials"]["password"] = "rotated"
        await publisher.upsert(ID, update)
        second = await server.wait_status(
            lambda s: (s["revision"] or 0) > first["revision"], "the update"
        )
        assert await alloc.echoes()

        cds.stop()
        assert await alloc.echoes(), "the last config keeps serving while the CDS is away"
        during = copy.deepcopy(update)
        during["admin"]["loglevel"] = "all:DEBUG"
        await publisher.upsert(ID, during)
        cds.start()
        caught_up = await server.wait_status(
            lambda s: s["admin"]["loglevel"] == "all:DEBUG", "the change made during the outage"
        )
        assert caught_up["revision"] > second["revision"]
        assert await alloc.echoes()

        await publisher.delete(ID)
        await server.wait_status(lambda s: s["configs"]["ignored"] == 1, "the delete to arrive")
        assert await alloc.echoes(), "a delete never tears down a running dataplane"
        status = await server.status()
        assert status["status"] == "READY"
        assert [lst["name"] for lst in status["listeners"]] == ["udp"]
        await alloc.close()
    finally:
        await server.close()


async def test_in_a_pod_an_http_origin_is_followed_without_the_watch_flag(
    tmp_path: Path, cds: CdsServer, publisher: ConfigPublisher, echo: UdpEcho
) -> None:
    """A Dataplane whose args leave out ``-w``: the pod's stunnerd still applies later edits."""
    port = listener_ports("udp")["udp"]
    config = rendered(port)
    await publisher.upsert(ID, config)
    server = ManagedStunnerd(
        tmp_path,
        None,
        "--id",
        ID,
        origin=cds.url,
        health=health_port(),
        env={"STUNNER_ADDR": "127.0.0.1", "KUBERNETES_SERVICE_HOST": "10.96.0.1"},
    )
    try:
        assert cds.url.startswith("http://")
        first = await server.ready()
        alloc = await EchoAllocation.open(port, (echo.host, echo.port))
        assert await alloc.echoes()

        update = copy.deepcopy(config)
        update["admin"]["loglevel"] = "all:DEBUG"
        await publisher.upsert(ID, update)
        followed = await server.wait_status(
            lambda s: s["admin"]["loglevel"] == "all:DEBUG", "the edit made after the first config"
        )
        assert followed["revision"] > first["revision"]
        assert await alloc.echoes()
        await alloc.close()
    finally:
        await server.close()
