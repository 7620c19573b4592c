"""WebSocket watches: v1 frames as upstream sends them, v2 envelopes, and watcher isolation."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from stunner_common.cds import (
    CDS_V2_SUBPROTOCOL,
    DeltaState,
    encode_v1_delete,
    parse_envelope,
)
from stunner_common.config import parse_config
from stunner_common.io.store import ConfigPublisher
from support.cds import (
    RunningCds,
    config,
    eventually,
    http_get,
    recv_json,
    recv_text,
    running_cds,
    wait_rev,
)
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration


def canonical(config_id: str, realm: str = "stunner.l7mp.io") -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(parse_config(config(config_id, realm)).canonical_json())
    return parsed


async def upsert(publisher: ConfigPublisher, config_id: str, realm: str = "r0") -> int:
    result = await publisher.upsert(config_id, parse_config(config(config_id, realm)))
    assert result.rev is not None
    return result.rev


async def names(ws: ClientConnection, count: int) -> list[str]:
    return sorted([(await recv_json(ws))["admin"]["name"] for _ in range(count)])


async def watchers(cds: RunningCds) -> int:
    count: int = (await http_get(cds, "/healthz")).json()["watchers"]
    return count


async def test_each_topic_gets_its_snapshot_then_its_updates(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    for config_id in ("ns1/gw1", "ns1/gw2", "ns2/gw1"):
        await upsert(publisher, config_id)
    base = f"{cds.ws_url}/api/v1/configs"
    async with (
        connect(f"{base}?watch=true") as all_ws,
        connect(f"{base}/ns1?watch=true") as ns1_ws,
        connect(f"{base}/ns1/gw2?watch=true&node=n1") as one_ws,
    ):
        assert await names(all_ws, 3) == ["ns1/gw1", "ns1/gw2", "ns2/gw1"]
        assert await names(ns1_ws, 2) == ["ns1/gw1", "ns1/gw2"]
        assert await names(one_ws, 1) == ["ns1/gw2"]
        await upsert(publisher, "ns2/gw1", "changed")
        await upsert(publisher, "ns1/gw2", "changed")
        await upsert(publisher, "ns3/new", "new")
        assert [(await recv_json(all_ws))["admin"]["name"] for _ in range(3)] == [
            "ns2/gw1",
            "ns1/gw2",
            "ns3/new",
        ]
        update = await recv_json(ns1_ws)
        assert update["admin"]["name"] == "ns1/gw2"
        assert update["auth"]["realm"] == "changed"
        assert (await recv_json(one_ws))["auth"]["realm"] == "changed"
        # Nothing else is pending for the narrower topics: the next frame is the next change.
        await upsert(publisher, "ns1/gw2", "again")
        assert (await recv_json(ns1_ws))["auth"]["realm"] == "again"
        assert (await recv_json(one_ws))["auth"]["realm"] == "again"


async def test_delete_sends_upstreams_zero_config_to_every_matching_watcher(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    await upsert(publisher, "ns1/gw1")
    base = f"{cds.ws_url}/api/v1/configs"
    async with (
        connect(f"{base}?watch=true") as all_ws,
        connect(f"{base}/ns1?watch=true") as ns_ws,
        connect(f"{base}/ns1/gw1?watch=true") as one_ws,
    ):
        for ws in (all_ws, ns_ws, one_ws):
            await recv_json(ws)
        await publisher.delete("ns1/gw1")
        for ws in (all_ws, ns_ws, one_ws):
            assert await recv_text(ws) == encode_v1_delete("ns1/gw1")
    assert (await http_get(cds, "/api/v1/configs/ns1/gw1")).status_code == 404


async def test_identical_upserts_produce_no_frame(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    await upsert(publisher, "ns/gw", "same")
    async with connect(f"{cds.ws_url}/api/v1/configs/ns?watch=true") as ws:
        assert (await recv_json(ws))["auth"]["realm"] == "same"
        assert not (await publisher.upsert("ns/gw", parse_config(config("ns/gw", "same")))).changed
        await publisher.replace_all({"ns/gw": parse_config(config("ns/gw", "same"))})
        await upsert(publisher, "ns/other", "marker")
        assert (await recv_json(ws))["admin"]["name"] == "ns/other"


async def test_a_watch_on_a_missing_config_waits_for_it(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    await upsert(publisher, "ns/sibling")
    async with connect(f"{cds.ws_url}/api/v1/configs/ns/later?watch=true") as ws:
        await upsert(publisher, "ns/sibling", "changed")
        await upsert(publisher, "ns/later", "here")
        frame = await recv_json(ws)
        assert frame["admin"]["name"] == "ns/later"


async def test_updates_to_one_id_arrive_in_order_up_to_the_newest(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    """60 quick updates: each watcher sees them in order, never an older one after a newer one,
    and ends on the newest. A change may replace its predecessor still queued for a watcher
    (latest wins, docs/limits.md), so a busy machine may skip some in between."""
    await upsert(publisher, "ns/gw", "r-start")
    url = f"{cds.ws_url}/api/v1/configs/ns/gw?watch=true"
    async with connect(url) as v1, connect(url, subprotocols=[CDS_V2_SUBPROTOCOL]) as v2:  # type: ignore[list-item]
        await recv_json(v1)
        state = DeltaState()
        state.apply(parse_envelope(await recv_text(v2)))
        for i in range(60):
            await upsert(publisher, "ns/gw", f"r-{i}")
        seen: list[int] = []
        while not seen or seen[-1] < 59:
            seen.append(int((await recv_json(v1))["auth"]["realm"].removeprefix("r-")))
        assert seen == sorted(set(seen))
        revs: list[int] = []
        while state.configs.get("ns/gw") != canonical("ns/gw", "r-59"):
            change = state.apply(parse_envelope(await recv_text(v2)))
            assert change is not None
            revs.append(change.rev)
        assert revs == sorted(set(revs))


async def test_v2_sends_snapshot_patch_and_delete_envelopes(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    # Once the CDS follows the store's history, the handshake names its epoch.
    await wait_rev(cds, await upsert(publisher, "ns/gw", "one"))
    async with connect(
        f"{cds.ws_url}/api/v1/configs?watch=true",
        subprotocols=[CDS_V2_SUBPROTOCOL],  # type: ignore[list-item]
    ) as ws:
        assert ws.subprotocol == CDS_V2_SUBPROTOCOL
        assert ws.response is not None
        assert ws.response.headers["x-stunner-resync"] == "full"
        epoch = ws.response.headers["x-stunner-epoch"]
        assert len(epoch) == 16
        snapshot = await recv_json(ws)
        assert snapshot == {
            "type": "snapshot",
            "id": "ns/gw",
            "rev": 1,
            "epoch": epoch,
            "config": canonical("ns/gw", "one"),
        }
        await upsert(publisher, "ns/gw", "two")
        patch = await recv_json(ws)
        assert patch == {
            "type": "patch",
            "id": "ns/gw",
            "rev": 2,
            "epoch": epoch,
            "patch": [{"op": "replace", "path": "/auth/realm", "value": "two"}],
        }
        await publisher.delete("ns/gw")
        assert await recv_json(ws) == {"type": "delete", "id": "ns/gw", "rev": 3, "epoch": epoch}


async def test_v2_resume_with_since_gets_only_later_changes(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    for config_id in ("ns/a", "ns/b", "ns/c"):
        await upsert(publisher, config_id)
    since = await upsert(publisher, "ns/a", "changed-before")
    await upsert(publisher, "ns/b", "changed-after")
    await publisher.delete("ns/c")
    last = await upsert(publisher, "ns/d", "new")
    await wait_rev(cds, last)
    epoch = (await http_get(cds, "/healthz")).json()["epoch"]
    async with connect(
        f"{cds.ws_url}/api/v1/configs/ns?watch=true&since={since}&epoch={epoch}",
        subprotocols=[CDS_V2_SUBPROTOCOL],  # type: ignore[list-item]
    ) as ws:
        assert ws.response is not None
        assert ws.response.headers["x-stunner-resync"] == "delta"
        got = [await recv_json(ws) for _ in range(3)]
        assert [(e["type"], e["id"]) for e in got] == [
            ("snapshot", "ns/b"),
            ("delete", "ns/c"),
            ("snapshot", "ns/d"),
        ]
        await upsert(publisher, "ns/a", "live")
        assert (await recv_json(ws))["id"] == "ns/a"


@pytest.mark.parametrize("since", ["-1", "abc", "1.5"])
async def test_v2_bad_since_is_refused_before_upgrading(cds: RunningCds, since: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(
            f"{cds.ws_url}/api/v1/configs?watch=true&since={since}",
            subprotocols=[CDS_V2_SUBPROTOCOL],  # type: ignore[list-item]
        ):
            pass
    assert refused.value.response.status_code == 400
    assert b"since" in (refused.value.response.body or b"")
    assert await watchers(cds) == 0


@pytest.mark.parametrize("query", ["", "?watch=false", "?watch=maybe"])
async def test_a_websocket_without_watch_true_is_refused_and_leaks_nothing(
    cds: RunningCds, query: str
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(f"{cds.ws_url}/api/v1/configs/ns/gw{query}"):
            pass
    assert refused.value.response.status_code == 400
    assert json.loads(refused.value.response.body or b"{}")["code"] == 400
    assert (await http_get(cds, "/api/v1/configs/ns/gw?watch=true")).status_code == 400
    assert await watchers(cds) == 0


async def test_origin_must_name_the_host_like_gorilla_checks_it(cds: RunningCds) -> None:
    host = f"127.0.0.1:{cds.port}"
    go_client_origin = f"http://{host}?node=worker-1&watch=true"
    async with connect(
        f"{cds.ws_url}/api/v1/configs?node=worker-1&watch=true",
        origin=go_client_origin,  # type: ignore[arg-type]
    ) as ws:
        # The Go client's liveness check: ping "keepalive" every 5 s, expect a pong.
        pong = await ws.ping(b"keepalive")
        async with asyncio.timeout(5):
            await pong
    with pytest.raises(InvalidStatus) as refused:
        async with connect(
            f"{cds.ws_url}/api/v1/configs?watch=true",
            origin="http://evil.example",  # type: ignore[arg-type]
        ):
            pass
    assert refused.value.response.status_code == 403


async def test_two_hundred_concurrent_watchers_all_get_every_update(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    await upsert(publisher, "ns/gw", "r-0")
    urls = [
        f"{cds.ws_url}/api/v1/configs{suffix}?watch=true"
        for suffix in ("", "/ns", "/ns/gw", "/ns/gw")
    ]
    clients = [await connect(urls[i % 4]) for i in range(200)]
    try:
        for ws in clients:
            await recv_json(ws)
        for i in range(1, 6):
            await upsert(publisher, "ns/gw", f"r-{i}")

        async def up_to_the_last(ws: ClientConnection) -> list[int]:
            seen = [int((await recv_json(ws))["auth"]["realm"][2:])]
            while seen[-1] != 5:
                seen.append(int((await recv_json(ws))["auth"]["realm"][2:]))
            return seen

        async with asyncio.timeout(10):
            results = await asyncio.gather(*(up_to_the_last(ws) for ws in clients))
        # a reader behind gets the newest state (latest wins): never an older after a newer
        assert all(r == sorted(set(r)) and r[0] == 1 and r[-1] == 5 for r in results)
    finally:
        await asyncio.gather(*(ws.close() for ws in clients))
    await eventually(lambda: _no_watchers(cds), what="all watchers gone")


async def test_idle_watchers_get_changes_written_directly_in_order(
    publisher: ConfigPublisher, cds: RunningCds
) -> None:
    await upsert(publisher, "ns/gw", "r-0")
    url = f"{cds.ws_url}/api/v1/configs/ns/gw?watch=true"
    v1 = [await connect(url) for _ in range(20)]
    v2 = [await connect(url, subprotocols=[CDS_V2_SUBPROTOCOL]) for _ in range(20)]  # type: ignore[list-item]
    try:
        states = [DeltaState() for _ in v2]
        for ws in v1:
            await recv_json(ws)
        for ws, state in zip(v2, states, strict=True):
            state.apply(parse_envelope(await recv_text(ws)))
        updates = 50
        for i in range(1, updates + 1):
            await upsert(publisher, "ns/gw", f"r-{i}")

        async def v1_realms(ws: ClientConnection) -> list[int]:
            seen = [int((await recv_json(ws))["auth"]["realm"][2:])]
            while seen[-1] != updates:
                seen.append(int((await recv_json(ws))["auth"]["realm"][2:]))
            return seen

        async def v2_realms(ws: ClientConnection, state: DeltaState) -> list[int]:
            seen: list[int] = []
            while not seen or seen[-1] != updates:
                state.apply(parse_envelope(await recv_text(ws)))
                seen.append(int(state.configs["ns/gw"]["auth"]["realm"][2:]))
            return seen

        async with asyncio.timeout(10):
            got = await asyncio.gather(
                *(v1_realms(ws) for ws in v1),
                *(v2_realms(ws, state) for ws, state in zip(v2, states, strict=True)),
            )
        # never an older state after a newer one, ending at the newest
        assert all(seen == sorted(set(seen)) and seen[-1] == updates for seen in got)
    finally:
        await asyncio.gather(*(ws.close() for ws in (*v1, *v2)))
    metrics = (await http_get(cds, "/metrics")).text
    for mode in ("v1", "v2"):
        line = next(
            (
                m
                for m in metrics.splitlines()
                if m.startswith(f'stunner_cds_frames_direct_total{{mode="{mode}"}}')
            ),
            "",
        )
        assert line, f"no {mode} frame was written directly"
        assert float(line.split()[-1]) > 0


async def _no_watchers(cds: RunningCds) -> bool:
    return await watchers(cds) == 0


async def _stalled_watch(cds: Any, path: str) -> ClientConnection:
    """A watch on a socket with a tiny receive buffer, for a client that stops reading."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", cds.port))
    return await connect(
        f"{cds.ws_url}{path}", sock=sock, max_queue=1, max_size=None, close_timeout=0.5
    )


async def test_a_watcher_that_stops_reading_gets_the_newest_config_when_it_reads_again(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    # 200 updates of 32 KB: more than the kernel buffers for the stalled connection (the send
    # buffer grows to 4 MB) and far more than its queue of 8; one config, so each newer update
    # replaces the one still queued.
    big = {"pad": "x" * 32_000}
    await publisher.upsert("ns/gw", config("ns/gw", "r-0", **big))
    # every change is offered at once (no v1 frame held back), so the queue is what is tested
    async with running_cds(redis.url, queue_size=8, send_timeout_s=30, v1_min_interval_s=0) as cds:
        path = "/api/v1/configs/ns/gw?watch=true"
        url = f"{cds.ws_url}{path}"
        async with (
            await _stalled_watch(cds, path) as slow,
            connect(url, max_size=None, max_queue=None) as fast,
        ):
            for ws in (slow, fast):
                await recv_json(ws)
            updates = 200
            for i in range(1, updates + 1):
                await publisher.upsert("ns/gw", config("ns/gw", f"r-{i}", **big))
            last = f"r-{updates}"
            for ws in (fast, slow):
                realms: list[int] = []
                async with asyncio.timeout(10):
                    while not realms or realms[-1] != updates:
                        realms.append(int((await recv_json(ws))["auth"]["realm"][2:]))
                # newer and newer, never an older state after a newer one, ending at the last
                assert realms == sorted(set(realms)), realms
                assert f"r-{realms[-1]}" == last
        metrics = (await http_get(cds, "/metrics")).text
        assert 'stunner_cds_watchers_dropped_total{reason="slow"}' not in metrics
        superseded = [
            line
            for line in metrics.splitlines()
            if line.startswith('stunner_cds_frames_superseded_total{mode="v1"}')
        ]
        assert superseded
        assert float(superseded[0].split()[-1]) > 0


async def test_a_slow_watcher_is_closed_with_a_reason_and_never_delays_others(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    # 200 configs of 32 KB changed once each: more than the kernel can buffer for the stalled
    # connection, and each a config of its own, so its queue (8) must overflow.
    big = {"pad": "x" * 32_000}
    await publisher.upsert("ns/gw", config("ns/gw", "r-0", **big))
    async with running_cds(redis.url, queue_size=8, send_timeout_s=30) as cds:
        path = "/api/v1/configs/ns?watch=true"
        url = f"{cds.ws_url}{path}"
        async with (
            await _stalled_watch(cds, path) as slow,
            # The fast ones buffer whatever arrives (max_queue=None): they always keep up.
            connect(url, max_size=None, max_queue=None) as fast1,
            connect(url, max_size=None, max_queue=None) as fast2,
        ):
            for ws in (slow, fast1, fast2):
                await recv_json(ws)
            updates = 200
            for i in range(1, updates + 1):
                await publisher.upsert(f"ns/gw{i}", config(f"ns/gw{i}", f"r-{i}", **big))
            # The fast watchers get every config while the slow one is not reading at all.
            for ws in (fast1, fast2):
                names = [(await recv_json(ws))["admin"]["name"] for _ in range(updates)]
                assert names == [f"ns/gw{i}" for i in range(1, updates + 1)]
            received, closed = await drain_until_closed(slow)
            assert received < updates
            assert closed.rcvd is not None
            assert closed.rcvd.code == 1013
            assert "too slow" in closed.rcvd.reason
        metrics = (await http_get(cds, "/metrics")).text
        assert 'stunner_cds_watchers_dropped_total{reason="slow"} 1.0' in metrics


async def drain_until_closed(ws: ClientConnection) -> tuple[int, ConnectionClosed]:
    """Read frames until the server closes; return how many arrived and the close."""
    received = 0
    async with asyncio.timeout(10):
        while True:
            try:
                await ws.recv()
            except ConnectionClosed as closed:
                return received, closed
            received += 1


async def test_a_client_that_never_answers_pings_is_dropped(
    no_leaked_tasks: None, redis: RedisServer
) -> None:
    async with (
        running_cds(redis.url, ping_interval_s=0.2, ping_timeout_s=1.0) as cds,
        connect(f"{cds.ws_url}/api/v1/configs?watch=true") as healthy,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", cds.port)
        writer.write(
            b"GET /api/v1/configs?watch=true HTTP/1.1\r\n"
            b"Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await writer.drain()
        async with asyncio.timeout(5):
            assert (await reader.readline()).startswith(b"HTTP/1.1 101")
            # Read (but never answer) the pings until the server hangs up.
            while await reader.read(4096):
                pass
        writer.close()
        await writer.wait_closed()
        # The client that answers pings is still served.
        await healthy.ping()
        assert await watchers(cds) == 1


async def test_a_watcher_whose_send_blocks_too_long_is_dropped(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    big = {"pad": "y" * 16_000}
    await publisher.upsert("ns/gw", config("ns/gw", "r-0", **big))
    async with running_cds(
        redis.url, queue_size=10_000, send_timeout_s=0.4, v1_min_interval_s=0
    ) as cds:
        stalled_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stalled_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled_sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(stalled_sock, ("127.0.0.1", cds.port))
        url = f"{cds.ws_url}/api/v1/configs/ns/gw?watch=true"
        async with (
            connect(
                url, sock=stalled_sock, max_queue=1, max_size=None, close_timeout=0.5
            ) as stalled,
            connect(url, max_size=None, max_queue=None) as healthy,
        ):
            await recv_json(stalled)
            await recv_json(healthy)
            # More than the kernel buffers of the stalled connection can absorb.
            for i in range(1, 401):
                await publisher.upsert("ns/gw", config("ns/gw", f"r-{i}", **big))
            realms = [(await recv_json(healthy))["auth"]["realm"] for _ in range(400)]
            assert realms[-1] == "r-400"

            async def dropped() -> bool:
                text = (await http_get(cds, "/metrics")).text
                return 'stunner_cds_watchers_dropped_total{reason="send_timeout"} 1.0' in text

            await eventually(dropped, what="the blocked watcher dropped")
            assert await watchers(cds) == 1


async def test_v1_watchers_get_a_config_at_most_once_per_interval_and_v2_every_change(
    no_leaked_tasks: None, redis: RedisServer, publisher: ConfigPublisher
) -> None:
    await upsert(publisher, "ns/gw", "r-0")
    async with running_cds(redis.url, v1_min_interval_s=0.3) as cds:
        url = f"{cds.ws_url}/api/v1/configs/ns/gw?watch=true"
        async with (
            connect(url) as v1,
            connect(url, subprotocols=[CDS_V2_SUBPROTOCOL]) as v2,  # type: ignore[list-item]
        ):
            state = DeltaState()
            await recv_json(v1)
            state.apply(parse_envelope(await recv_text(v2)))
            loop = asyncio.get_running_loop()
            updates = 20

            async def v2_revisions() -> list[int]:
                revisions = []
                while state.configs["ns/gw"]["auth"]["realm"] != f"r-{updates}":
                    envelope = parse_envelope(await recv_text(v2))
                    state.apply(envelope)
                    revisions.append(envelope.rev)
                return revisions

            async def v1_arrivals() -> list[tuple[float, int]]:
                seen: list[tuple[float, int]] = []
                while not seen or seen[-1][1] != updates:
                    realm = (await recv_json(v1))["auth"]["realm"]
                    seen.append((loop.time(), int(realm[2:])))
                return seen

            reading = asyncio.gather(v2_revisions(), v1_arrivals())
            started = loop.time()
            for i in range(1, updates + 1):
                await upsert(publisher, "ns/gw", f"r-{i}")
            async with asyncio.timeout(10):
                revisions, seen = await reading
            elapsed = loop.time() - started
            assert len(revisions) == updates  # every change, as a patch
            numbers = [n for _, n in seen]
            assert numbers == sorted(set(numbers))  # never an older state after a newer one
            # the first change at once, then at most one frame per interval
            assert len(seen) <= 2 + elapsed / 0.3, (seen, elapsed)
            gaps = [b - a for (a, _), (b, _) in itertools.pairwise(seen)]
            assert all(gap >= 0.15 for gap in gaps), gaps  # 0.3 s, less the jitter of delivery
        metrics = (await http_get(cds, "/metrics")).text
        held = next(
            line for line in metrics.splitlines() if line.startswith("stunner_cds_v1_changes_held")
        )
        assert float(held.split()[-1]) >= updates - len(seen)
