"""The CDS's JSON Patch of a config change: it applies (with jsonpatch, as every v2 client does)
to exactly the new config, and names only what changed."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st

from stunner_cds.store.diff import json_patch

keys = st.sampled_from(["a", "b", "c", "a/b", "~0", "", "endpoints"])
leaves = st.none() | st.integers(-5, 5) | st.text(max_size=3)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


def applied(old: Any, ops: list[dict[str, Any]]) -> Any:
    return jsonpatch.apply_patch(copy.deepcopy(old), ops)


@given(values, values)
def test_the_patch_turns_the_old_document_into_the_new_one(old: Any, new: Any) -> None:
    ops = json_patch(old, new)
    assert json.dumps(applied(old, ops), sort_keys=True) == json.dumps(new, sort_keys=True)
    assert json.loads(json.dumps(ops)) == ops  # plain JSON, as the envelope carries it


@given(values)
def test_an_unchanged_document_has_an_empty_patch(doc: Any) -> None:
    assert json_patch(doc, copy.deepcopy(doc)) == []


def config(endpoints: list[list[str]]) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {"name": "ns/gw"},
        "listeners": [{"name": "ns/gw/udp", "port": 3478, "routes": ["ns/r0", "ns/r1"]}],
        "clusters": [
            {"name": f"ns/r{i}", "type": "STATIC", "endpoints": eps}
            for i, eps in enumerate(endpoints)
        ],
    }


def test_one_endpoint_changed_among_ten_thousand_is_one_replace() -> None:
    endpoints = [[f"10.{i}.{j // 256}.{j % 256}" for j in range(100)] for i in range(100)]
    old = copy.deepcopy(config(endpoints))
    endpoints[57][33] = "10.200.0.1"
    new = config(endpoints)
    ops = json_patch(old, new)
    assert ops == [{"op": "replace", "path": "/clusters/57/endpoints/33", "value": "10.200.0.1"}]
    assert applied(old, ops) == new


def test_an_endpoint_list_that_grew_is_replaced_whole_and_a_new_key_added() -> None:
    old = config([["10.0.0.1"], ["10.0.0.2"]])
    new = config([["10.0.0.1"], ["10.0.0.2", "10.0.0.3"]])
    new["admin"]["loglevel"] = "all:DEBUG"
    del new["listeners"][0]["port"]
    ops = json_patch(old, new)
    assert ops == [
        {"op": "add", "path": "/admin/loglevel", "value": "all:DEBUG"},
        {"op": "remove", "path": "/listeners/0/port"},
        {"op": "replace", "path": "/clusters/1/endpoints", "value": ["10.0.0.2", "10.0.0.3"]},
    ]
    assert applied(old, ops) == new


def test_a_value_of_another_json_type_is_replaced() -> None:
    assert json_patch({"a": 1}, {"a": 1.5}) == [{"op": "replace", "path": "/a", "value": 1.5}]
    assert json_patch({"a": [1]}, {"a": {"0": 1}}) == [
        {"op": "replace", "path": "/a", "value": {"0": 1}}
    ]
