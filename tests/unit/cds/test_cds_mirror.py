"""The CDS mirror turns snapshots and stream entries into exactly the changes watchers need."""

from __future__ import annotations

import pytest

from stunner_cds.store.mirror import Change, ConfigMirror, StoreResetError, StreamGapError
from stunner_common.io.store import Position, Snapshot, StoreEvent


def snap(configs: dict[str, str], rev: int, revs: dict[str, int] | None = None) -> Snapshot:
    return Snapshot(configs, revs or dict.fromkeys(configs, rev), rev, f"{rev}-0")


def up(rev: int, config_id: str, text: str) -> StoreEvent:
    return StoreEvent(f"{100 + rev}-0", "upsert", config_id, rev, text)


def delete(rev: int, config_id: str) -> StoreEvent:
    return StoreEvent(f"{100 + rev}-0", "delete", config_id, rev, "")


def test_first_load_reports_every_config_as_new() -> None:
    mirror = ConfigMirror()
    changes = mirror.load(snap({"a/x": '{"v":1}', "b/y": '{"v":2}'}, 2))
    assert [(c.id, c.old, c.new) for c in changes] == [
        ("a/x", None, {"v": 1}),
        ("b/y", None, {"v": 2}),
    ]
    assert mirror.loaded
    assert mirror.rev == 2
    assert mirror.last_event_id == "2-0"


def test_reload_reports_only_what_differs_including_deletes() -> None:
    mirror = ConfigMirror()
    mirror.load(snap({"a/x": '{"v":1}', "a/y": '{"v":2}', "a/z": '{"v":3}'}, 3))
    changes = mirror.load(snap({"a/x": '{"v":1}', "a/y": '{"v":9}', "a/w": '{"v":4}'}, 7))
    assert changes == [
        Change("a/w", 7, None, {"v": 4}),
        Change("a/y", 7, {"v": 2}, {"v": 9}),
        Change("a/z", 7, {"v": 3}, None),
    ]
    assert mirror.tombstones == {"a/z": 7}


def test_contiguous_events_apply_and_identical_upserts_change_nothing() -> None:
    mirror = ConfigMirror()
    mirror.load(snap({}, 0))
    assert mirror.apply(up(1, "a/x", '{"v":1}')) == Change("a/x", 1, None, {"v": 1})
    assert mirror.apply(up(2, "a/x", '{"v":1}')) is None
    assert mirror.apply(up(3, "a/x", '{"v":2}')) == Change("a/x", 3, {"v": 1}, {"v": 2})
    assert mirror.apply(delete(4, "a/x")) == Change("a/x", 4, {"v": 2}, None)
    assert mirror.apply(delete(5, "a/x")) is None
    assert mirror.rev == 5
    assert mirror.entries == {}


def test_replayed_events_are_ignored() -> None:
    mirror = ConfigMirror()
    mirror.load(snap({}, 0))
    mirror.apply(up(1, "a/x", '{"v":1}'))
    mirror.apply(up(2, "a/x", '{"v":2}'))
    assert mirror.apply(up(1, "a/x", '{"v":1}')) is None
    assert mirror.entries["a/x"].config == {"v": 2}


def test_a_jump_in_revisions_is_a_gap_that_changes_nothing() -> None:
    mirror = ConfigMirror()
    mirror.load(snap({"a/x": '{"v":1}'}, 4))
    with pytest.raises(StreamGapError, match="from revision 4 to 6"):
        mirror.apply(up(6, "a/x", '{"v":2}'))
    assert mirror.rev == 4
    assert mirror.entries["a/x"].config == {"v": 1}


def test_stored_values_that_are_not_json_objects_are_skipped() -> None:
    mirror = ConfigMirror()
    changes = mirror.load(snap({"a/x": "not json", "a/y": "[1]", "a/z": "{}"}, 1))
    assert [c.id for c in changes] == ["a/z"]
    assert mirror.apply(up(2, "a/z", "{broken")) is None
    assert mirror.entries["a/z"].config == {}


def test_changed_since_lists_changes_and_deletes_after_a_revision() -> None:
    mirror = ConfigMirror()
    mirror.load(snap({"a/x": "{}", "a/y": "{}"}, 2, {"a/x": 1, "a/y": 2, "a/gone": 2}))
    mirror.apply(up(3, "a/x", '{"v":1}'))
    mirror.apply(delete(4, "a/y"))
    changed, deleted = mirror.changed_since(2)
    assert [i for i, _ in changed] == ["a/x"]
    assert deleted == [("a/y", 4)]
    changed, deleted = mirror.changed_since(1)
    assert deleted == [("a/gone", 2), ("a/y", 4)]


def test_an_entry_of_another_epoch_is_a_store_reset() -> None:
    mirror = ConfigMirror()
    mirror.load(Snapshot({"a/x": '{"v":1}'}, {"a/x": 4}, 4, "4-0", "e1"))
    with pytest.raises(StoreResetError, match="epoch 'e2'"):
        mirror.apply(StoreEvent("105-0", "upsert", "a/x", 5, '{"v":2}', "e2"))
    assert (mirror.rev, mirror.epoch) == (4, "e1")


@pytest.mark.parametrize(
    ("epoch", "rev", "reset"),
    [("e1", 4, False), ("e1", 9, False), ("e1", 2, True), ("e2", 9, True), ("", 0, True)],
)
def test_a_reload_is_a_reset_when_the_epoch_changed_or_revisions_went_back(
    epoch: str, rev: int, reset: bool
) -> None:
    mirror = ConfigMirror()
    mirror.load(Snapshot({"a/x": '{"v":1}'}, {"a/x": 4}, 4, "4-0", "e1"))
    assert mirror.is_reset(Snapshot({}, {}, rev, f"{rev}-0", epoch)) is reset


def test_a_store_never_written_gave_out_no_revision_to_confuse() -> None:
    mirror = ConfigMirror()
    mirror.load(Snapshot({}, {}, 0, "0-0", ""))
    assert not mirror.is_reset(Snapshot({"a/x": '{"v":1}'}, {"a/x": 1}, 1, "1-0", "e1"))


def test_a_reload_reports_its_changes_in_revision_order_deletes_at_their_revision() -> None:
    mirror = ConfigMirror()
    mirror.load(snap({"a/x": '{"v":1}', "a/y": '{"v":1}', "a/z": '{"v":1}'}, 3))
    changes = mirror.load(
        Snapshot(
            {"a/x": '{"v":2}', "a/y": '{"v":2}'},
            {"a/x": 9, "a/y": 5, "a/z": 7},
            9,
            "9-0",
        )
    )
    assert [(c.id, c.rev) for c in changes] == [("a/y", 5), ("a/z", 7), ("a/x", 9)]


@pytest.mark.parametrize(
    ("at", "following", "reason"),
    [
        (Position("e1", 4), None, None),
        (Position("e1", 6), 5, None),
        (Position("e1", 6), 6, "store at revision 6, mirror at 4"),
        (Position("e1", 2), None, "store at revision 2, mirror at 4"),
        (Position("e2", 4), None, "store epoch 'e2', mirror at epoch 'e1'"),
    ],
)
def test_a_reconnect_resumes_the_tail_only_in_the_same_history(
    at: Position, following: int | None, reason: str | None
) -> None:
    mirror = ConfigMirror()
    assert mirror.resync_reason(at, following) == "initial load"
    mirror.load(Snapshot({"a/x": '{"v":1}'}, {"a/x": 4}, 4, "4-0", "e1"))
    assert mirror.resync_reason(at, following) == reason
