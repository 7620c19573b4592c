"""``parse_envelope``: the v2 frames a client accepts, and one clear error for everything else."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stunner_common.cds import (
    DeleteEnvelope,
    Envelope,
    EnvelopeError,
    PatchEnvelope,
    SnapshotEnvelope,
    encode_delete,
    encode_patch,
    encode_snapshot,
    parse_envelope,
)
from support.fresh import modules_after, roots

PATCH = [{"op": "replace", "path": "/auth/realm", "value": "y"}]


def frame(**fields: Any) -> str:
    return json.dumps(fields)


@pytest.mark.parametrize(
    ("text", "envelope"),
    [
        (
            encode_snapshot("a/b", 1, {"auth": {"realm": "x"}}, "e1"),
            SnapshotEnvelope(id="a/b", rev=1, config={"auth": {"realm": "x"}}, epoch="e1"),
        ),
        (
            encode_patch("a/b", 2, PATCH, "e1"),
            PatchEnvelope(id="a/b", rev=2, patch=PATCH, epoch="e1"),
        ),
        (encode_delete("a/b", 3, "e1"), DeleteEnvelope(id="a/b", rev=3, epoch="e1")),
        (encode_delete("a/b", 3), DeleteEnvelope(id="a/b", rev=3, epoch=None)),
        (
            frame(type="snapshot", id="a/b", rev=0, config={}, epoch=None),
            SnapshotEnvelope(id="a/b", rev=0, config={}),
        ),
        (frame(type="patch", id="", rev=7, patch=[]), PatchEnvelope(id="", rev=7, patch=[])),
        (
            frame(type="delete", id="a/b", rev=3, config=[], patch=1, later="x"),
            DeleteEnvelope(id="a/b", rev=3),
        ),
        (' {"type":"delete","id":"a/b","rev":3}\n', DeleteEnvelope(id="a/b", rev=3)),
        (
            '{"type":"delete","id":"\\u00e9/\\ud83d\\ude00","rev":3}',
            DeleteEnvelope(id="é/😀", rev=3),
        ),
        (
            frame(type="delete", id="a/b", rev=10**30),
            DeleteEnvelope(id="a/b", rev=10**30),
        ),
    ],
)
def test_a_well_formed_frame_becomes_its_envelope(text: str, envelope: Envelope) -> None:
    assert parse_envelope(text) == envelope
    assert parse_envelope(text.encode()) == envelope


def test_the_fields_of_each_envelope_are_what_the_frame_said() -> None:
    snapshot = parse_envelope(encode_snapshot("ns/gw", 5, {"version": "v1"}, "e9"))
    assert isinstance(snapshot, SnapshotEnvelope)
    assert (snapshot.type, snapshot.id, snapshot.rev, snapshot.epoch) == (
        "snapshot",
        "ns/gw",
        5,
        "e9",
    )
    assert snapshot.config == {"version": "v1"}
    patch = parse_envelope(encode_patch("ns/gw", 6, PATCH))
    assert isinstance(patch, PatchEnvelope)
    assert (patch.type, patch.id, patch.rev, patch.epoch, patch.patch) == (
        "patch",
        "ns/gw",
        6,
        None,
        PATCH,
    )
    delete = parse_envelope(encode_delete("ns/gw", 7, "e9"))
    assert isinstance(delete, DeleteEnvelope)
    assert (delete.type, delete.id, delete.rev, delete.epoch) == ("delete", "ns/gw", 7, "e9")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        ('{"type":"delete","id":"a/b","rev":3} x', "not JSON"),
        ("\ufeff" + encode_delete("a/b", 3), "not JSON"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
        ('{"type":"delete","id":"a/b","rev":' + "1" * 5000 + "}", "not JSON"),
        ('{"type":"delete","id":"\\ud800","rev":3}', "lone surrogate"),
        ('{"type":"snapshot","id":"a/b","rev":3,"config":{"k":"\\uDFFF"}}', "lone surrogate"),
        ("[]", "not a JSON object but array"),
        ('"delete"', "not a JSON object but string"),
        ("null", "not a JSON object but null"),
        (frame(id="a/b", rev=3), "type null is not snapshot, patch or delete"),
        (frame(type="resync", id="a/b", rev=3), "type 'resync' is not snapshot, patch or delete"),
        (frame(type="Delete", id="a/b", rev=3), "type 'Delete' is not"),
        (frame(type=1, id="a/b", rev=3), "type integer is not"),
        (frame(type="delete", rev=3), "delete: id must be a string, not null"),
        (frame(type="delete", id=5, rev=3), "delete: id must be a string, not integer"),
        (frame(type="delete", id="a/b"), "delete for 'a/b': rev must be an integer, not null"),
        (frame(type="delete", id="a/b", rev=True), "rev must be an integer, not boolean"),
        (frame(type="delete", id="a/b", rev=False), "rev must be an integer, not boolean"),
        (frame(type="delete", id="a/b", rev="5"), "rev must be an integer, not string"),
        (frame(type="delete", id="a/b", rev=5.0), "rev must be an integer, not number"),
        ('{"type":"delete","id":"a/b","rev":1e3}', "rev must be an integer, not number"),
        (frame(type="delete", id="a/b", rev=3, epoch=5), "epoch must be a string, not integer"),
        (frame(type="delete", id="a/b", rev=3, epoch={}), "epoch must be a string, not object"),
        (frame(type="snapshot", id="a/b", rev=3), "snapshot for 'a/b': config must be an object"),
        (frame(type="snapshot", id="a/b", rev=3, config=[]), "config must be an object, not array"),
        (
            frame(type="snapshot", id="a/b", rev=3, config="{}"),
            "config must be an object, not string",
        ),
        (frame(type="patch", id="a/b", rev=3), "patch for 'a/b': patch must be an array, not null"),
        (frame(type="patch", id="a/b", rev=3, patch={}), "patch must be an array, not object"),
        (frame(type="patch", id="a/b", rev=3, patch=[{}, 1]), r"patch\[1\] must be an object"),
        (frame(type="patch", id="a/b", rev=3, patch=[[]]), r"patch\[0\] must be an object"),
    ],
)
def test_a_malformed_frame_raises_an_envelope_error_that_says_why(text: str, message: str) -> None:
    with pytest.raises(EnvelopeError, match=message):
        parse_envelope(text)


def test_a_frame_of_bytes_must_be_utf8() -> None:
    with pytest.raises(EnvelopeError, match="invalid UTF-8"):
        parse_envelope(b'{"type":"delete","id":"\xff","rev":3}')
    with pytest.raises(EnvelopeError, match="not JSON"):
        parse_envelope(b"\xef\xbb\xbf" + encode_delete("a/b", 3).encode())


def test_an_envelope_error_is_a_value_error_with_no_json_cause_attached() -> None:
    with pytest.raises(EnvelopeError) as caught:
        parse_envelope("{")
    assert isinstance(caught.value, ValueError)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


@pytest.mark.parametrize(
    "fields",
    [{"type": "x" * 10_000, "id": "a/b", "rev": 3}, {"type": "delete", "id": "x" * 10_000}],
)
def test_a_long_type_or_id_is_cut_short_in_the_message(fields: dict[str, Any]) -> None:
    with pytest.raises(EnvelopeError) as caught:
        parse_envelope(frame(**fields))
    assert len(str(caught.value)) < 120


def test_the_client_side_of_the_wire_imports_no_pydantic() -> None:
    modules = modules_after("import stunner_common.cds, stunner_common.io.cds")
    assert "stunner_common.io.cds" in modules
    assert roots(modules) & {"pydantic", "pydantic_core"} == set()
