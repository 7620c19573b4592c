"""WebSocket frames (RFC 6455 section 5.2), checked against the `websockets` package's own codec:
a frame we build parses there to the same message, and a frame it builds parses here."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from stunner_common.wsframe import (
    BINARY,
    CLOSE,
    PING,
    TEXT,
    FrameError,
    Header,
    accept_key,
    close_payload,
    encode_frame,
    mask,
    parse_close,
)


def their_parse(data: bytes, *, masked: bool) -> Frame:
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=masked)
    try:
        next(parser)
    except StopIteration as done:
        frame: Frame = done.value
        return frame
    raise AssertionError("incomplete frame")


def our_parse(data: bytes, *, from_server: bool) -> tuple[Header, bytes]:
    header = Header.parse(data[:2], from_server=from_server)
    extra = data[2 : 2 + header.extra]
    length = header.payload_length(extra)
    rest = data[2 + header.extra :]
    if header.masked:
        rest = mask(rest[4:], rest[:4])
    assert len(rest) == length
    return header, rest


def test_the_accept_key_is_the_rfc_example() -> None:
    # RFC 6455 section 1.3.
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_every_length_form_round_trips_both_ways(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    ours = encode_frame(BINARY, payload, b"\x01\x02\x03\x04")
    theirs = their_parse(ours, masked=True)
    assert (theirs.opcode, theirs.data, theirs.fin) == (Opcode.BINARY, payload, True)
    server = Frame(Opcode.BINARY, payload).serialize(mask=False)
    assert encode_frame(BINARY, payload) == server
    header, got = our_parse(server, from_server=True)
    assert (header.opcode, header.fin, got) == (BINARY, True, payload)


@given(
    st.sampled_from([TEXT, BINARY, PING]),
    st.binary(max_size=300),
    st.binary(min_size=4, max_size=4),
)
def test_a_masked_client_frame_parses_in_websockets(opcode: int, data: bytes, key: bytes) -> None:
    if opcode == PING:
        data = data[:125]
    if opcode == TEXT:
        data = data.decode("latin-1").encode()
    frame = their_parse(encode_frame(opcode, data, key), masked=True)
    assert (int(frame.opcode), frame.data) == (opcode, data)


@given(st.binary(max_size=200), st.binary(min_size=4, max_size=4))
def test_masking_twice_gives_the_payload_back(data: bytes, key: bytes) -> None:
    assert mask(mask(data, key), key) == data
    assert len(mask(data, key)) == len(data)


@pytest.mark.parametrize(
    ("head", "code", "why"),
    [
        (bytes((0x81 | 0x40, 0)), 1002, "reserved bit"),
        (bytes((0x83, 0)), 1002, "unknown opcode"),
        (bytes((0x09, 0)), 1002, "control frame is fragmented"),
        (bytes((0x89, 126)), 1002, "longer than 125"),
        (bytes((0x81, 0x85)), 1002, "server's frame is masked"),
    ],
)
def test_a_server_frame_that_breaks_a_rule_is_refused_with_its_close_code(
    head: bytes, code: int, why: str
) -> None:
    with pytest.raises(FrameError, match=why) as refused:
        Header.parse(head, from_server=True)
    assert refused.value.code == code


def test_a_client_frame_must_be_masked() -> None:
    with pytest.raises(FrameError, match="not masked"):
        Header.parse(bytes((0x81, 5)), from_server=False)
    assert Header.parse(bytes((0x81, 0x85)), from_server=False).masked


def test_close_payloads_round_trip_and_bad_ones_are_refused() -> None:
    assert parse_close(close_payload(1000, "bye")) == (1000, "bye")
    assert parse_close(close_payload(4001, "x" * 200)) == (4001, "x" * 123)
    assert parse_close(b"") == (1005, "")
    assert their_parse(encode_frame(CLOSE, close_payload(1001, "away")), masked=False).data == (
        struct.pack("!H", 1001) + b"away"
    )
    for bad, code in [(b"\x03", 1002), (struct.pack("!H", 1005), 1002), (b"\x03\xe8\xff", 1007)]:
        with pytest.raises(FrameError) as refused:
            parse_close(bad)
        assert refused.value.code == code
