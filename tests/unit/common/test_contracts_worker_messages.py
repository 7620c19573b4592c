"""The supervisor ↔ worker messages: every record round-trips through bytes and through its JSON
object, and a message of another protocol version or an unknown op is refused by name."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stunner_common.contracts.socket_key import SocketKey
from stunner_common.contracts.worker_messages import (
    PROTOCOL_VERSION,
    ApplyReply,
    ApplyRequest,
    ChannelMessage,
    CloseRequest,
    DoneReply,
    DrainRequest,
    ErrorReply,
    FreezeRequest,
    JournalBatch,
    JournalDelete,
    JournalEntry,
    ListenerSocket,
    NonceKey,
    OffloadMap,
    OffloadOff,
    PingRequest,
    RelaySocket,
    Reply,
    Request,
    StatsReply,
    StatsRequest,
    WorkerMessage,
    WorkerMessageError,
    decode_channel,
    decode_reply,
    decode_request,
    encode,
    encode_fields,
)

text = st.text(max_size=20)
ids = st.integers(min_value=0, max_value=2**53)
ports = st.integers(min_value=0, max_value=65535)
floats = st.floats(allow_nan=False, allow_infinity=False)
keys = st.builds(SocketKey, st.sampled_from(["udp", "tcp"]), text, ports)
addresses = st.tuples(text, ports)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | floats | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(text, json_values, max_size=4)

requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(ApplyRequest, text, st.lists(keys, max_size=3).map(tuple), st.none() | text, ids),
    st.builds(StatsRequest, ids),
    st.builds(DrainRequest, ids),
    st.builds(FreezeRequest, st.booleans(), ids),
    st.builds(PingRequest, ids),
    st.builds(CloseRequest, ids),
)
replies: st.SearchStrategy[Reply] = st.one_of(
    st.builds(
        ApplyReply,
        st.booleans(),
        st.booleans(),
        st.lists(text, max_size=3).map(tuple),
        st.none() | text,
        floats,
        st.lists(addresses, max_size=3).map(tuple),
        st.lists(json_objects, max_size=3).map(tuple),
        ids,
    ),
    st.builds(StatsReply, json_objects, json_objects, st.none() | json_objects, ids),
    st.builds(DoneReply, ids),
    st.builds(ErrorReply, text, ids),
)
channel_messages: st.SearchStrategy[ChannelMessage] = st.one_of(
    st.builds(NonceKey, st.binary(max_size=32)),
    st.builds(ListenerSocket, keys),
    st.builds(RelaySocket),
    st.builds(OffloadMap, text, st.dictionaries(text, text, max_size=3), ports),
    st.builds(OffloadOff, text),
    st.builds(
        JournalBatch,
        st.lists(
            st.builds(JournalEntry, text, addresses, floats, text, st.integers(0, 2))
            | st.builds(JournalDelete, text, addresses),
            max_size=4,
        ).map(tuple),
    ),
)

Decoder = Callable[[bytes | Mapping[str, Any]], WorkerMessage]


def round_trips(message: WorkerMessage, decode: Decoder) -> None:
    assert decode(encode(message)) == message
    assert decode(encode_fields(message)) == message
    fields = json.loads(encode(message))
    assert (fields["op"], fields["version"]) == (message.OP, PROTOCOL_VERSION)


@given(requests)
def test_every_request_round_trips(message: Request) -> None:
    round_trips(message, decode_request)


@given(replies)
def test_every_reply_round_trips(message: Reply) -> None:
    round_trips(message, decode_reply)


@given(channel_messages)
def test_every_channel_message_round_trips(message: ChannelMessage) -> None:
    round_trips(message, decode_channel)


def test_a_listener_socket_travels_as_the_socket_keys_fields() -> None:
    key = SocketKey("udp", "0.0.0.0", 3478)
    fields = encode_fields(ListenerSocket(key))
    assert fields == {"op": "socket", "version": PROTOCOL_VERSION, **key.encode()}


def test_a_journal_batch_counts_the_fds_of_its_new_entries() -> None:
    batch = JournalBatch(
        (
            JournalEntry("udp", ("203.0.113.7", 1), 1.0, "{}", 2),
            JournalEntry("udp", ("203.0.113.7", 1), 2.0, "{}"),
            JournalDelete("udp", ("203.0.113.7", 2)),
            JournalEntry("udp", ("203.0.113.7", 3), 3.0, "{}", 1),
        )
    )
    assert batch.fd_count == 3
    assert encode_fields(batch)["items"][2] == ["del", "udp", "203.0.113.7", 2]


@pytest.mark.parametrize(
    "item",
    [
        ["set", "udp", "203.0.113.7", 1, 1.0, 1],  # no record
        ["set", "udp", "203.0.113.7", 1, 1.0, -1, "{}"],
        ["set", "udp", "203.0.113.7", "1", 1.0, 0, "{}"],
        ["set", "udp", "203.0.113.7", 1, 1.0, 0, {"client": []}],  # a record as an object
        ["del", "udp", "203.0.113.7"],
        ["move", "udp", "203.0.113.7", 1],
        "del udp",
    ],
)
def test_a_journal_item_of_another_shape_is_refused_naming_it(item: object) -> None:
    fields = {"op": "journal", "version": PROTOCOL_VERSION, "items": [item]}
    with pytest.raises(WorkerMessageError, match="journal item"):
        decode_channel(fields)


@pytest.mark.parametrize(
    ("decode", "message"),
    [
        (decode_request, StatsRequest(7)),
        (decode_reply, DoneReply(7)),
        (decode_channel, RelaySocket()),
    ],
)
@pytest.mark.parametrize("version", [None, 0, PROTOCOL_VERSION + 1, "1", True])
def test_a_message_of_another_protocol_version_is_refused_naming_it(
    decode: Decoder, message: WorkerMessage, version: object
) -> None:
    fields = {**encode_fields(message), "version": version}
    if version is None:
        del fields["version"]
    with pytest.raises(WorkerMessageError, match=f"protocol version {version!r}") as refused:
        decode(fields)
    assert str(PROTOCOL_VERSION) in str(refused.value)


@pytest.mark.parametrize(
    ("decode", "op"),
    [
        (decode_request, "reboot"),
        (decode_request, "journal"),  # a channel message is not a request
        (decode_reply, "apply_now"),
        (decode_channel, "stats"),
        (decode_channel, None),
    ],
)
def test_an_unknown_op_is_refused_naming_it(decode: Decoder, op: object) -> None:
    fields = {"op": op, "version": PROTOCOL_VERSION, "id": 3}
    with pytest.raises(WorkerMessageError, match=f"op {op!r}") as refused:
        decode(json.dumps(fields).encode())
    assert refused.value.ident == 3


@pytest.mark.parametrize(
    "fields",
    [
        {"op": "apply", "sockets": []},  # no config
        {"op": "apply", "config": "{}", "sockets": [{"kind": "udp"}]},
        {"op": "freeze", "frozen": "yes"},
    ],
)
def test_a_request_with_a_missing_or_mistyped_field_is_refused_with_its_id(
    fields: dict[str, Any],
) -> None:
    with pytest.raises(WorkerMessageError, match=str(fields["op"])) as refused:
        decode_request({**fields, "version": PROTOCOL_VERSION, "id": 9})
    assert refused.value.ident == 9


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]", b'"apply"'])
def test_what_is_not_a_json_object_is_refused(data: bytes) -> None:
    with pytest.raises(WorkerMessageError):
        decode_request(data)


def test_a_channel_message_with_a_bad_nonce_key_or_items_is_refused() -> None:
    with pytest.raises(WorkerMessageError, match="hex"):
        decode_channel({"op": "nonce_key", "version": PROTOCOL_VERSION, "key": "zz"})
    with pytest.raises(WorkerMessageError, match="items"):
        decode_channel({"op": "journal", "version": PROTOCOL_VERSION, "items": {"a": 1}})
