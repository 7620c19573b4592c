"""The supervisor ↔ worker messages: every record round-trips through bytes and through its JSON
object (the journal's binary batches through their bytes), and a message of another protocol
version or an unknown op, or a batch cut short or corrupt, is refused by name."""

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
    CloseRequest,
    DoneReply,
    DrainRequest,
    ErrorReply,
    FreezeRequest,
    JournalBatch,
    JournalDelete,
    JournalEntry,
    JsonChannelMessage,
    JsonMessage,
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
    journal_delete,
    journal_message,
    journal_set,
    read_journal,
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
channel_messages: st.SearchStrategy[JsonChannelMessage] = st.one_of(
    st.builds(NonceKey, st.binary(max_size=32)),
    st.builds(ListenerSocket, keys),
    st.builds(RelaySocket),
    st.builds(OffloadMap, text, st.dictionaries(text, text, max_size=3), ports),
    st.builds(OffloadOff, text),
)
journal_batches: st.SearchStrategy[JournalBatch] = st.builds(
    JournalBatch,
    st.lists(
        st.builds(JournalEntry, text, addresses, floats, st.binary(max_size=64), st.integers(0, 2))
        | st.builds(JournalDelete, text, addresses),
        max_size=6,
    ).map(tuple),
)

Decoder = Callable[[bytes | Mapping[str, Any]], WorkerMessage]


def round_trips(message: JsonMessage, decode: Decoder) -> None:
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
def test_every_channel_message_round_trips(message: JsonChannelMessage) -> None:
    round_trips(message, decode_channel)


def test_a_listener_socket_travels_as_the_socket_keys_fields() -> None:
    key = SocketKey("udp", "0.0.0.0", 3478)
    fields = encode_fields(ListenerSocket(key))
    assert fields == {"op": "socket", "version": PROTOCOL_VERSION, **key.encode()}


@given(journal_batches)
def test_every_journal_batch_round_trips_through_its_bytes_keeping_each_record_as_sent(
    batch: JournalBatch,
) -> None:
    data = encode(batch)
    assert data.startswith(b"SJB")
    decoded = decode_channel(data)
    assert decoded == batch
    assert isinstance(decoded, JournalBatch)
    assert [type(item) for item in decoded.items] == [type(item) for item in batch.items]


def test_a_journal_batch_counts_the_fds_of_its_new_entries() -> None:
    batch = JournalBatch(
        (
            JournalEntry("udp", ("203.0.113.7", 1), 1.0, b"{}", 2),
            JournalEntry("udp", ("203.0.113.7", 1), 2.0, b"{}"),
            JournalDelete("udp", ("203.0.113.7", 2)),
            JournalEntry("udp", ("203.0.113.7", 3), 3.0, b"{}", 1),
        )
    )
    assert batch.fd_count == 3
    assert decode_channel(encode(batch)) == batch
    assert read_journal(encode(batch))[2] == ("udp", ("203.0.113.7", 2), 0.0, None, 0)


def sample_batch() -> bytes:
    return journal_message(
        [
            journal_set(b"udp", b"203.0.113.7", 1, 1.0, 1, b'{"client":["203.0.113.7",1]}'),
            journal_delete(b"udp", b"203.0.113.7", 2),
            journal_set("\u00e9".encode(), b"2001:db8::1", 3, 2.0, 0, b"{}"),
        ]
    )


def test_a_journal_batch_cut_short_anywhere_is_refused_as_such() -> None:
    data = sample_batch()
    assert len(read_journal(data)) == 3
    for size in range(len(data)):
        with pytest.raises(WorkerMessageError, match=r"cut short|not a journal batch"):
            read_journal(data[:size])


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (lambda data: data + b"x", "bytes left over: 1"),
        (lambda data: b"SJA" + data[3:], "not a journal batch"),
        (lambda data: data[:3] + bytes([PROTOCOL_VERSION + 1]) + data[4:], "protocol version"),
        (lambda data: data[:4] + b"\x00\x04" + data[6:], "cut short at item 3 of 4"),
        (lambda data: data[:4] + b"\x00\x02" + data[6:], "left over"),
        (lambda data: data[:6] + b"\x07" + data[7:], "journal item 0 of kind 7"),
        (lambda data: data.replace(b"udp", b"\xffdp", 1), "not UTF-8"),
        (lambda data: data.replace(b"203.0.113.7", b"203.0.113\xc3", 1), "not UTF-8"),
    ],
)
def test_a_corrupt_journal_batch_is_refused_saying_why(
    corrupt: Callable[[bytes], bytes], reason: str
) -> None:
    with pytest.raises(WorkerMessageError, match=reason):
        read_journal(corrupt(sample_batch()))


@pytest.mark.parametrize(
    "fields",
    [
        (b"udp", b"h" * 256, 1, 1.0, 0, b"{}"),  # a host longer than its length field
        (b"udp", b"203.0.113.7", 65536, 1.0, 0, b"{}"),
        (b"udp", b"203.0.113.7", 1, 1.0, 256, b"{}"),
    ],
)
def test_a_journal_item_that_does_not_fit_its_fields_is_refused(
    fields: tuple[bytes, bytes, int, float, int, bytes],
) -> None:
    with pytest.raises(WorkerMessageError, match="journal item"):
        journal_set(*fields)


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
    decode: Decoder, message: JsonMessage, version: object
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
    with pytest.raises(WorkerMessageError, match="op 'journal'"):  # a batch is not JSON
        decode_channel({"op": "journal", "version": PROTOCOL_VERSION, "items": []})
