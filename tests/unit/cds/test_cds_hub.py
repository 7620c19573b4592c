"""Fan-out: topics, modes, initial snapshots, resume, the newest change of a config replacing the
one still queued, and slow watchers dropped alone."""

from __future__ import annotations

import asyncio
import json
from collections import deque

import pytest

from stunner_cds.store.hub import Hub, Mode, Topic, Watcher
from stunner_cds.store.mirror import ConfigMirror
from stunner_common.cds import DeltaState, encode_v1_delete, parse_envelope
from stunner_common.io.store import Snapshot, StoreEvent


def hub_with(configs: dict[str, dict[str, object]], *, max_queue: int = 16) -> Hub:
    mirror = ConfigMirror()
    texts = {i: json.dumps(c) for i, c in configs.items()}
    mirror.load(Snapshot(texts, dict.fromkeys(texts, 1), 1, "1-0", EPOCH))
    return Hub(mirror, max_queue=max_queue)


EPOCH = "e-one"


def cfg(config_id: str, realm: str = "r") -> dict[str, object]:
    return {"version": "v1", "admin": {"name": config_id}, "auth": {"realm": realm}}


def change(hub: Hub, config_id: str, text: str | None) -> None:
    rev = hub.mirror.rev + 1
    op = "delete" if text is None else "upsert"
    event = StoreEvent(f"{rev}-1", op, config_id, rev, text or "", EPOCH)  # type: ignore[arg-type]
    c = hub.mirror.apply(event)
    hub.publish([c] if c else [])


@pytest.mark.parametrize(
    ("topic", "ids"),
    [
        (Topic(), ["a/x", "a/y", "b/x"]),
        (Topic("a"), ["a/x", "a/y"]),
        (Topic("a", "y"), ["a/y"]),
        (Topic("c", "x"), []),
    ],
)
def test_subscribing_queues_a_snapshot_of_the_topic(topic: Topic, ids: list[str]) -> None:
    hub = hub_with({i: cfg(i) for i in ("a/x", "a/y", "b/x")})
    watcher, _ = hub.subscribe(topic, Mode.V1)
    assert [json.loads(f)["admin"]["name"] for f in watcher.frames] == ids


def test_changes_reach_only_matching_watchers() -> None:
    hub = hub_with({})
    everything, _ = hub.subscribe(Topic(), Mode.V1)
    namespace_a, _ = hub.subscribe(Topic("a"), Mode.V1)
    only_b, _ = hub.subscribe(Topic("b", "x"), Mode.V1)
    change(hub, "a/x", json.dumps(cfg("a/x")))
    change(hub, "b/x", json.dumps(cfg("b/x")))
    assert len(everything.frames) == 2
    assert len(namespace_a.frames) == 1
    assert [json.loads(f)["admin"]["name"] for f in only_b.frames] == ["b/x"]
    for watcher in (everything, namespace_a, only_b):
        watcher.frames.clear()  # sent
    change(hub, "a/x", None)
    assert everything.frames == namespace_a.frames == deque([encode_v1_delete("a/x")])
    assert not only_b.frames


def test_v2_watchers_get_patches_for_updates_and_envelopes_for_deletes() -> None:
    hub = hub_with({"a/x": cfg("a/x", "one")})
    watcher, delta = hub.subscribe(Topic(), Mode.V2)
    assert not delta
    change(hub, "a/x", json.dumps(cfg("a/x", "two")))
    frames = [json.loads(f) for f in watcher.frames]
    watcher.frames.clear()  # sent
    change(hub, "a/x", None)
    frames += [json.loads(f) for f in watcher.frames]
    assert [f["type"] for f in frames] == ["snapshot", "patch", "delete"]
    assert frames[1]["patch"] == [{"op": "replace", "path": "/auth/realm", "value": "two"}]
    assert [f["rev"] for f in frames] == [1, 2, 3]


def test_v2_resume_sends_only_what_changed_after_since() -> None:
    hub = hub_with({"a/x": cfg("a/x"), "a/y": cfg("a/y")})
    change(hub, "a/x", json.dumps(cfg("a/x", "new")))
    change(hub, "a/y", None)
    watcher, delta = hub.subscribe(Topic("a"), Mode.V2, since=1, epoch=EPOCH)
    assert delta
    frames = [json.loads(f) for f in watcher.frames]
    assert [(f["type"], f["id"], f["rev"], f["epoch"]) for f in frames] == [
        ("snapshot", "a/x", 2, EPOCH),
        ("delete", "a/y", 3, EPOCH),
    ]
    nothing, delta = hub.subscribe(Topic("a"), Mode.V2, since=3, epoch=EPOCH)
    assert delta
    assert not nothing.frames


@pytest.mark.parametrize("epoch", [None, "", "e-other"])
def test_v2_resume_in_another_epoch_gets_a_full_snapshot(epoch: str | None) -> None:
    hub = hub_with({"a/x": cfg("a/x"), "a/y": cfg("a/y")})
    change(hub, "a/x", json.dumps(cfg("a/x", "new")))
    watcher, delta = hub.subscribe(Topic("a"), Mode.V2, since=1, epoch=epoch)
    assert not delta
    frames = [json.loads(f) for f in watcher.frames]
    # In revision order, so that a client cut off half-way resumes without a gap.
    assert [(f["type"], f["id"], f["rev"], f["epoch"]) for f in frames] == [
        ("snapshot", "a/y", 1, EPOCH),
        ("snapshot", "a/x", 2, EPOCH),
    ]


def test_a_store_reset_closes_v2_watchers_and_keeps_v1_ones() -> None:
    hub = hub_with({"a/x": cfg("a/x")})
    v1, _ = hub.subscribe(Topic(), Mode.V1)
    v2, _ = hub.subscribe(Topic("a"), Mode.V2)
    assert hub.reset("config store reset") == 1
    assert v2.closed_reason == "config store reset"
    assert v2.close_code == 1012
    assert v1.closed_reason is None
    assert hub.watcher_count() == 1


def test_v2_resume_from_a_revision_the_hub_never_had_gets_a_full_snapshot() -> None:
    hub = hub_with({"a/x": cfg("a/x")})
    watcher, delta = hub.subscribe(Topic(), Mode.V2, since=99)
    assert not delta
    assert [json.loads(f)["type"] for f in watcher.frames] == ["snapshot"]


def test_a_slow_watcher_is_dropped_with_a_reason_and_the_others_get_everything() -> None:
    hub = hub_with({}, max_queue=4)
    slow, _ = hub.subscribe(Topic(), Mode.V1)
    fast, _ = hub.subscribe(Topic(), Mode.V1)
    for i in range(10):
        change(hub, f"a/x{i}", json.dumps(cfg(f"a/x{i}", str(i))))
        fast.frames.clear()  # the fast watcher keeps up
    assert slow.closed_reason is not None
    assert "too slow" in slow.closed_reason
    assert fast.closed_reason is None
    assert hub.watcher_count() == 1
    change(hub, "a/x", json.dumps(cfg("a/x", "last")))
    assert json.loads(fast.frames[-1])["auth"]["realm"] == "last"


def test_unsubscribed_watchers_get_nothing_more() -> None:
    hub = hub_with({})
    watcher, _ = hub.subscribe(Topic("a", "x"), Mode.V1)
    hub.unsubscribe(watcher)
    change(hub, "a/x", json.dumps(cfg("a/x")))
    assert not watcher.frames
    assert hub.watcher_count() == 0


def test_node_watchers_get_the_node_address_placeholder_rewritten() -> None:
    config = cfg("a/x") | {"listeners": [{"name": "l", "address": "__node_address_placeholder"}]}
    hub = hub_with({"a/x": config})
    with_node, _ = hub.subscribe(Topic("a", "x"), Mode.V1, node="worker-1")
    without, _ = hub.subscribe(Topic("a", "x"), Mode.V1)
    assert '"address":"$STUNNER_ADDR"' in with_node.frames[0]
    assert '"address":"__node_address_placeholder"' in without.frames[0]


def test_a_snapshot_larger_than_the_queue_bound_does_not_get_a_new_watcher_dropped() -> None:
    hub = hub_with({f"a/gw{i}": cfg(f"a/gw{i}") for i in range(20)}, max_queue=4)
    watcher, _ = hub.subscribe(Topic(), Mode.V1)
    assert len(watcher.frames) == 20
    for i in range(4):
        change(hub, f"a/new{i}", json.dumps(cfg(f"a/new{i}", str(i))))
    assert watcher.closed_reason is None
    change(hub, "a/new4", json.dumps(cfg("a/new4", "one too many")))
    assert watcher.closed_reason is not None


@pytest.mark.parametrize("mode", [Mode.V1, Mode.V2])
def test_a_watcher_behind_gets_the_newest_state_of_a_config_and_is_never_dropped_for_it(
    mode: Mode,
) -> None:
    hub = hub_with({"a/x": cfg("a/x", "0"), "a/y": cfg("a/y")}, max_queue=4)
    watcher, _ = hub.subscribe(Topic("a"), mode)
    initial = list(watcher.frames)
    for i in range(1, 101):
        change(hub, "a/x", json.dumps(cfg("a/x", str(i))))
        if i == 50:
            change(hub, "a/y", json.dumps(cfg("a/y", "y")))
    assert watcher.closed_reason is None
    # the initial frames stay as they were (a client counts them as its snapshot), then one
    # frame per config, in the order of their newest change
    assert list(watcher.frames)[:2] == initial
    live = list(watcher.frames)[2:]
    assert len(live) == 2
    assert watcher.superseded == 99
    if mode is Mode.V1:
        assert [json.loads(f)["auth"]["realm"] for f in live] == ["y", "100"]
        return
    # v2: a patch of a change whose predecessor was never sent would not apply: a snapshot
    # replaces it, and the queue stays in revision order, as a resuming client needs
    frames = [parse_envelope(f) for f in watcher.frames]
    assert [(f.type, f.id) for f in frames[2:]] == [("patch", "a/y"), ("snapshot", "a/x")]
    assert [f.rev for f in frames] == sorted(f.rev for f in frames)
    state = DeltaState()
    for frame in frames:
        state.apply(frame)
    assert state.configs["a/x"]["auth"] == {"realm": "100"}
    assert state.configs["a/y"]["auth"] == {"realm": "y"}


def test_a_change_after_its_predecessor_was_taken_for_sending_is_a_patch() -> None:
    hub = hub_with({"a/x": cfg("a/x", "0")})
    watcher, _ = hub.subscribe(Topic("a", "x"), Mode.V2)
    change(hub, "a/x", json.dumps(cfg("a/x", "1")))
    watcher.frames.clear()  # taken by the writer, on its way to the client
    change(hub, "a/x", json.dumps(cfg("a/x", "2")))
    assert [parse_envelope(f).type for f in watcher.frames] == ["patch"]
    assert watcher.superseded == 0


def test_a_delete_replaces_a_queued_change_and_a_recreation_replaces_the_delete() -> None:
    hub = hub_with({"a/x": cfg("a/x", "0")})
    watcher, _ = hub.subscribe(Topic("a", "x"), Mode.V2)
    watcher.frames.clear()
    change(hub, "a/x", json.dumps(cfg("a/x", "1")))
    change(hub, "a/x", None)
    assert [parse_envelope(f).type for f in watcher.frames] == ["delete"]
    change(hub, "a/x", json.dumps(cfg("a/x", "again")))
    (frame,) = [parse_envelope(f) for f in watcher.frames]
    assert frame.type == "snapshot"
    assert frame.config["auth"] == {"realm": "again"}


def placeholder_cfg(config_id: str, realm: str = "r") -> dict[str, object]:
    listener = {"name": "l", "address": "__node_address_placeholder", "port": 3478}
    return cfg(config_id, realm) | {"listeners": [listener]}


@pytest.mark.parametrize("mode", [Mode.V1, Mode.V2])
def test_node_watchers_of_one_node_share_one_filled_frame_per_change(mode: Mode) -> None:
    hub = hub_with({"a/x": placeholder_cfg("a/x")})
    one, _ = hub.subscribe(Topic("a", "x"), mode, node="worker-1")
    two, _ = hub.subscribe(Topic("a", "x"), mode, node="worker-1")
    plain, _ = hub.subscribe(Topic("a", "x"), mode)
    change(hub, "a/x", json.dumps(placeholder_cfg("a/x", "changed")))
    assert one.frames[-1] is two.frames[-1]
    assert "__node_address_placeholder" not in one.frames[-1]
    assert "$STUNNER_ADDR" in one.frames[-1] or mode is Mode.V2
    assert "__node_address_placeholder" in plain.frames[-1] or mode is Mode.V2


def test_a_node_watcher_resuming_gets_the_placeholder_filled() -> None:
    hub = hub_with({"a/x": placeholder_cfg("a/x")})
    change(hub, "a/x", json.dumps(placeholder_cfg("a/x", "changed")))
    watcher, delta = hub.subscribe(Topic("a", "x"), Mode.V2, since=1, epoch=EPOCH, node="worker-1")
    assert delta
    assert '"address":"$STUNNER_ADDR"' in watcher.frames[0]


# --- v1 frames at most once per interval (CDS_V1_MIN_INTERVAL_S) --------------------------------

INTERVAL_S = 0.1


def throttled_hub(configs: dict[str, dict[str, object]]) -> tuple[Hub, list[None]]:
    hub = hub_with(configs)
    hub.v1_min_interval_s = INTERVAL_S
    held: list[None] = []
    hub.on_v1_held = lambda: held.append(None)
    return hub, held


class Reader:
    """A connection that takes every frame at once: what the watcher was sent, in order."""

    def __init__(self, watcher: Watcher) -> None:
        self.texts = [*watcher.frames]  # the initial frames, as its writer would send them
        watcher.frames.clear()
        watcher.sink = self

    def ready(self) -> bool:
        return True

    def write(self, frame: bytes) -> None:
        size = frame[1] & 0x7F
        start = 2 if size < 126 else 4 if size == 126 else 10
        self.texts.append(frame[start:].decode())


def subscribed(hub: Hub, topic: Topic, mode: Mode) -> Reader:
    return Reader(hub.subscribe(topic, mode)[0])


def realms(texts: list[str]) -> list[str]:
    return [json.loads(t)["auth"]["realm"] for t in texts]


async def test_v1_watchers_get_a_burst_as_its_first_change_then_its_newest_state() -> None:
    hub, held = throttled_hub({"a/x": cfg("a/x")})
    v1 = subscribed(hub, Topic("a", "x"), Mode.V1)
    v2 = subscribed(hub, Topic("a", "x"), Mode.V2)
    v1.texts.clear()
    v2.texts.clear()
    for i in range(1, 11):
        change(hub, "a/x", json.dumps(cfg("a/x", f"r{i}")))
    assert realms(v1.texts) == ["r1"]  # the first at once, the rest held
    assert len(v2.texts) == 10  # v2 patches are never held
    await asyncio.sleep(INTERVAL_S * 2)
    assert realms(v1.texts) == ["r1", "r10"]
    assert len(held) == 8  # r2 .. r9, each replaced by a newer change before its turn
    assert len(v2.texts) == 10


async def test_fan_out_is_timed_per_hand_out_and_a_held_change_is_timed_when_released() -> None:
    hub, _ = throttled_hub({"a/x": cfg("a/x")})
    timed: list[float] = []
    hub.on_fanout = timed.append
    v1 = subscribed(hub, Topic("a", "x"), Mode.V1)
    v1.texts.clear()
    for i in range(1, 4):
        change(hub, "a/x", json.dumps(cfg("a/x", f"r{i}")))
    assert realms(v1.texts) == ["r1"]
    assert len(timed) == 1  # r2 and r3 reached nobody yet: no fan-out to time
    await asyncio.sleep(INTERVAL_S * 2)
    assert realms(v1.texts) == ["r1", "r3"]
    assert len(timed) == 2  # the release of r3 is a fan-out of its own
    assert all(t >= 0 for t in timed)


async def test_a_change_after_a_quiet_interval_goes_at_once_and_configs_are_held_apart() -> None:
    hub, _ = throttled_hub({"a/x": cfg("a/x"), "a/y": cfg("a/y")})
    v1 = subscribed(hub, Topic("a"), Mode.V1)
    v1.texts.clear()
    change(hub, "a/x", json.dumps(cfg("a/x", "x1")))
    change(hub, "a/y", json.dumps(cfg("a/y", "y1")))  # another config: not held by a/x's
    assert realms(v1.texts) == ["x1", "y1"]
    await asyncio.sleep(INTERVAL_S * 1.5)
    change(hub, "a/x", json.dumps(cfg("a/x", "x2")))
    assert realms(v1.texts) == ["x1", "y1", "x2"]
    await asyncio.sleep(INTERVAL_S * 1.5)
    assert realms(v1.texts) == ["x1", "y1", "x2"]  # nothing held, nothing sent again


async def test_a_held_update_then_delete_reaches_v1_watchers_as_the_delete() -> None:
    hub, _ = throttled_hub({"a/x": cfg("a/x")})
    v1 = subscribed(hub, Topic("a", "x"), Mode.V1)
    v1.texts.clear()
    change(hub, "a/x", json.dumps(cfg("a/x", "r1")))
    change(hub, "a/x", json.dumps(cfg("a/x", "r2")))
    change(hub, "a/x", None)
    await asyncio.sleep(INTERVAL_S * 2)
    assert v1.texts[1:] == [encode_v1_delete("a/x")]
    change(hub, "a/x", json.dumps(cfg("a/x", "back")))  # recreated, held behind the delete
    await asyncio.sleep(INTERVAL_S * 2)
    assert json.loads(v1.texts[-1])["auth"]["realm"] == "back"


async def test_a_watcher_that_joins_while_a_change_is_held_gets_the_newest_state() -> None:
    hub, _ = throttled_hub({"a/x": cfg("a/x")})
    first = subscribed(hub, Topic("a", "x"), Mode.V1)
    change(hub, "a/x", json.dumps(cfg("a/x", "r1")))
    change(hub, "a/x", json.dumps(cfg("a/x", "r2")))  # held
    late = subscribed(hub, Topic("a", "x"), Mode.V1)
    assert realms(late.texts) == ["r2"]  # the snapshot is the mirror's: never older
    await asyncio.sleep(INTERVAL_S * 2)
    assert realms(first.texts)[-1] == "r2"
    assert realms(late.texts) == ["r2", "r2"]  # the held change too: the same state again


async def test_closing_the_hub_sends_no_held_change_afterwards() -> None:
    hub, _ = throttled_hub({"a/x": cfg("a/x")})
    v1 = subscribed(hub, Topic("a", "x"), Mode.V1)
    v1.texts.clear()
    change(hub, "a/x", json.dumps(cfg("a/x", "r1")))
    change(hub, "a/x", json.dumps(cfg("a/x", "r2")))
    hub.close_all("shutting down")
    await asyncio.sleep(INTERVAL_S * 2)
    assert realms(v1.texts) == ["r1"]


async def test_with_no_v1_watcher_nothing_is_held_and_a_later_one_is_throttled() -> None:
    hub, held = throttled_hub({"a/x": cfg("a/x")})
    v1, _ = hub.subscribe(Topic("a", "x"), Mode.V1)
    hub.unsubscribe(v1)
    hub.unsubscribe(v1)  # twice: counted once
    for i in range(1, 4):
        change(hub, "a/x", json.dumps(cfg("a/x", f"r{i}")))
    assert held == []
    again = subscribed(hub, Topic(), Mode.V1)
    again.texts.clear()
    for i in range(4, 7):
        change(hub, "a/x", json.dumps(cfg("a/x", f"r{i}")))
    assert realms(again.texts) == ["r4"]
    await asyncio.sleep(INTERVAL_S * 2)
    assert realms(again.texts) == ["r4", "r6"]
    assert len(held) == 1


def test_without_an_interval_every_change_reaches_v1_watchers_and_no_loop_is_needed() -> None:
    hub = hub_with({"a/x": cfg("a/x")})
    v1 = subscribed(hub, Topic("a", "x"), Mode.V1)
    v1.texts.clear()
    for i in range(1, 4):
        change(hub, "a/x", json.dumps(cfg("a/x", f"r{i}")))
    assert realms(v1.texts) == ["r1", "r2", "r3"]
