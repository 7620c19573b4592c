"""The CDS wire contract: upstream v1 bytes and the v2 envelopes with the delta client state."""

from __future__ import annotations

import json

import pytest

from stunner_common.cds import (
    CdsProtocolError,
    ConfigChange,
    DeleteEnvelope,
    DeltaState,
    EnvelopeError,
    PatchEnvelope,
    SnapshotEnvelope,
    encode_config_list,
    encode_error,
    encode_v1_config,
    encode_v1_delete,
    parse_envelope,
)
from stunner_common.config import parse_config, zero_config
from stunner_common.io.cds import watch_url

UPSTREAM_DELETE_FRAME = (
    '{"version":"v1","admin":{"name":"ns1/gw1"},"auth":{"type":"static",'
    '"realm":"stunner.l7mp.io","credentials":{"password":"dummy-password",'
    '"username":"dummy-username"}}}'
)


def test_delete_frame_is_byte_for_byte_the_upstream_zero_config() -> None:
    assert encode_v1_delete("ns1/gw1") == UPSTREAM_DELETE_FRAME


def test_delete_frame_validates_to_the_shared_zero_config() -> None:
    parsed = parse_config(encode_v1_delete("ns1/gw1"))
    assert parsed.canonical_json() == zero_config("ns1/gw1").canonical_json()


def test_v1_frame_uses_go_field_order_and_drops_omitempty_fields() -> None:
    canonical = json.loads(
        parse_config(
            {
                "version": "v1",
                "admin": {"name": "ns/gw"},
                "auth": {"credentials": {"username": "u", "password": "p"}},
                "listeners": [{"name": "l", "protocol": "udp", "routes": ["r"]}],
            }
        ).canonical_json()
    )
    frame = encode_v1_config(canonical)
    assert frame.startswith('{"version":"v1","admin":{"name":"ns/gw","loglevel":"all:INFO",')
    assert '"metrics_endpoint"' not in frame  # empty string: omitempty
    assert '"license_config"' not in frame  # nil pointer: omitempty
    assert '"healthcheck_endpoint":"http://:8086"' in frame
    assert (
        '"listeners":[{"name":"l","protocol":"TURN-UDP","address":"0.0.0.0","port":3478,' in frame
    )
    assert '"clusters"' not in frame  # empty slice: omitempty
    assert parse_config(frame).canonical_json() == json.dumps(
        canonical, sort_keys=True, separators=(",", ":")
    )


@pytest.mark.parametrize(
    ("admin", "expected"),
    [
        ({"name": "a", "healthcheck_endpoint": ""}, '{"name":"a","healthcheck_endpoint":""}'),
        ({"name": "a", "healthcheck_endpoint": None}, '{"name":"a"}'),
        ({"name": "a", "user_quota": 0}, '{"name":"a"}'),
        ({"name": "a", "user_quota": 3}, '{"name":"a","user_quota":3}'),
    ],
)
def test_v1_admin_fields_follow_go_pointer_and_omitempty_rules(
    admin: dict[str, object], expected: str
) -> None:
    frame = encode_v1_config({"version": "v1", "admin": admin, "auth": {}})
    assert frame == '{"version":"v1","admin":' + expected + ',"auth":{"credentials":null}}'


def test_config_list_body_ends_with_a_newline_and_never_has_null_items() -> None:
    assert encode_config_list([]) == '{"version":"v1","items":[]}\n'
    assert encode_error(404, "Config not found for ID a/b") == (
        '{"code":404,"message":"Config not found for ID a/b"}\n'
    )


def test_envelopes_parse_by_type_and_reject_unknown_types() -> None:
    assert isinstance(
        parse_envelope('{"type":"snapshot","id":"a/b","rev":1,"config":{}}'), SnapshotEnvelope
    )
    assert isinstance(
        parse_envelope('{"type":"patch","id":"a/b","rev":2,"patch":[]}'), PatchEnvelope
    )
    assert isinstance(parse_envelope('{"type":"delete","id":"a/b","rev":3}'), DeleteEnvelope)
    with pytest.raises(EnvelopeError):
        parse_envelope('{"type":"resync","id":"a/b","rev":3}')


def test_delta_state_applies_snapshot_patch_and_delete_in_turn() -> None:
    state = DeltaState()
    first = state.apply(
        SnapshotEnvelope(type="snapshot", id="a/b", rev=1, config={"auth": {"realm": "x"}})
    )
    assert first == ConfigChange("a/b", 1, {"auth": {"realm": "x"}})
    patched = state.apply(
        PatchEnvelope(
            type="patch",
            id="a/b",
            rev=2,
            patch=[{"op": "replace", "path": "/auth/realm", "value": "y"}],
        )
    )
    assert patched == ConfigChange("a/b", 2, {"auth": {"realm": "y"}})
    assert state.apply(DeleteEnvelope(type="delete", id="a/b", rev=3)) == ConfigChange(
        "a/b", 3, None
    )
    assert state.configs == {}
    assert state.rev == 3


def test_delta_state_reports_no_change_for_a_repeated_snapshot_or_unknown_delete() -> None:
    state = DeltaState()
    envelope = SnapshotEnvelope(type="snapshot", id="a/b", rev=1, config={"k": 1})
    assert state.apply(envelope) is not None
    assert state.apply(envelope) is None
    assert state.apply(DeleteEnvelope(type="delete", id="c/d", rev=2)) is None


def test_delta_state_refuses_a_patch_for_a_config_it_does_not_hold() -> None:
    state = DeltaState()
    with pytest.raises(CdsProtocolError, match="does not hold"):
        state.apply(PatchEnvelope(type="patch", id="a/b", rev=1, patch=[]))
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=1, config={}))
    with pytest.raises(CdsProtocolError, match="does not apply"):
        state.apply(
            PatchEnvelope(type="patch", id="a/b", rev=2, patch=[{"op": "remove", "path": "/x"}])
        )


@pytest.mark.parametrize(
    ("base", "ns", "name", "url"),
    [
        ("http://h:13478", None, None, "ws://h:13478/api/v1/configs?watch=true"),
        ("https://h", "ns", None, "wss://h/api/v1/configs/ns?watch=true"),
        ("h:1", "ns", "gw", "ws://h:1/api/v1/configs/ns/gw?watch=true"),
        ("ws://h:1/x", "n s", "g/w", "ws://h:1/api/v1/configs/n%20s/g%2Fw?watch=true"),
    ],
)
def test_watch_url_maps_http_schemes_to_websocket_ones(
    base: str, ns: str | None, name: str | None, url: str
) -> None:
    assert watch_url(base, ns, name) == url


def test_a_reset_reports_what_was_held_as_resync_deletes() -> None:
    state = DeltaState()
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=4, config={"x": 1}))
    assert state.reset() == [ConfigChange("a/b", 4, None, resync=True)]
    assert (state.configs, state.rev) == ({}, 0)


def test_a_resume_names_the_revision_and_the_epoch_it_counts_in() -> None:
    state = DeltaState()
    assert state.resume_params() is None  # nothing held: ask for a snapshot
    assert state.begin(delta=False, epoch="e1") == []
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=4, config={}, epoch="e1"))
    assert state.resume_params() == {"since": "4", "epoch": "e1"}
    assert state.begin(delta=True, epoch="e1") == []


def test_a_resume_in_another_epoch_is_a_protocol_error() -> None:
    state = DeltaState()
    state.begin(delta=False, epoch="e1")
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=4, config={}, epoch="e1"))
    with pytest.raises(CdsProtocolError, match="resumed in store epoch 'e2'"):
        state.begin(delta=True, epoch="e2")


def test_an_envelope_of_another_epoch_is_refused_while_anything_is_held() -> None:
    state = DeltaState()
    state.begin(delta=False, epoch="e1")
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=9, config={}, epoch="e1"))
    with pytest.raises(CdsProtocolError, match="epoch 'e2'"):
        state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=1, config={}, epoch="e2"))
    assert state.rev == 9


def test_a_full_snapshot_forgets_the_old_epochs_revision() -> None:
    state = DeltaState()
    state.begin(delta=False, epoch="e1")
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=9, config={"v": 1}, epoch="e1"))
    assert state.begin(delta=False, epoch="e2") == [ConfigChange("a/b", 9, None, resync=True)]
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=2, config={"v": 2}, epoch="e2"))
    assert (state.rev, state.epoch) == (2, "e2")
    assert state.resume_params() == {"since": "2", "epoch": "e2"}


def test_a_client_that_holds_nothing_follows_the_first_epoch_it_hears_of() -> None:
    state = DeltaState()
    state.begin(delta=False, epoch="")  # a store nobody has written yet
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=1, config={}, epoch="e1"))
    assert (state.rev, state.epoch) == (1, "e1")


def test_a_complete_snapshot_puts_the_client_at_the_servers_revision() -> None:
    state = DeltaState()
    # The server is at revision 7 (a delete at 7 left nothing to send); two frames follow.
    state.begin(delta=False, epoch="e1", rev=7, frames=2)
    state.apply(SnapshotEnvelope(type="snapshot", id="a/b", rev=2, config={}, epoch="e1"))
    assert state.rev == 2, "cut off here, it resumes from what it has seen"
    state.apply(SnapshotEnvelope(type="snapshot", id="a/c", rev=5, config={}, epoch="e1"))
    assert state.rev == 7
    state.begin(delta=True, epoch="e1", rev=9, frames=0)
    assert state.rev == 9
