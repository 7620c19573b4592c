"""turncat's TURN framing and message helpers: pure functions over bytes."""

from __future__ import annotations

import pytest
from aioice import stun

from stunner_common.auth import long_term_key
from turncat.wire import (
    LongTermAuth,
    StreamDeframer,
    build_request,
    channel_frame,
    error_of,
    integrity_ok,
    is_channel_data,
    parse_stun,
)


def test_channel_data_is_padded_to_four_bytes_only_on_streams() -> None:
    assert channel_frame(0x4000, b"abc", pad=False) == b"\x40\x00\x00\x03abc"
    assert channel_frame(0x4000, b"abc", pad=True) == b"\x40\x00\x00\x03abc\x00"
    assert channel_frame(0x4001, b"abcd", pad=True) == b"\x40\x01\x00\x04abcd"
    assert is_channel_data(b"\x40\x00\x00\x00")
    assert not is_channel_data(b"\x00\x01\x00\x00")


def test_stream_deframer_reassembles_frames_split_at_every_byte() -> None:
    request = bytes(build_request(stun.Method.BINDING))
    stream = (
        channel_frame(0x4000, b"hello", pad=True)
        + request
        + channel_frame(0x4000, b"", pad=True)
        + channel_frame(0x4002, b"1234", pad=True)
    )
    deframer = StreamDeframer()
    frames: list[bytes] = []
    for i in range(len(stream)):
        frames += deframer.feed(stream[i : i + 1])
    assert frames == [
        b"\x40\x00\x00\x05hello",
        request,
        b"\x40\x00\x00\x00",
        b"\x40\x02\x00\x041234",
    ]


def test_stream_deframer_returns_every_frame_of_one_big_read() -> None:
    stream = b"".join(channel_frame(0x4000, bytes([i]) * i, pad=True) for i in range(50))
    frames = StreamDeframer().feed(stream)
    assert [len(f) - 4 for f in frames] == list(range(50))


def test_stream_deframer_rejects_a_stream_out_of_sync() -> None:
    with pytest.raises(ValueError, match="out of sync"):
        StreamDeframer().feed(b"\xff\xff\x00\x00")


def test_signed_request_verifies_with_the_long_term_key() -> None:
    auth = LongTermAuth.derive("user1", "passwd1", "stunner.l7mp.io", b"nonce")
    assert auth.key == long_term_key("user1", "stunner.l7mp.io", "passwd1")
    msg = build_request(stun.Method.ALLOCATE, {"LIFETIME": 600}, auth)
    parsed = parse_stun(bytes(msg))
    assert parsed is not None
    assert parsed.attributes["USERNAME"] == "user1"
    assert parsed.attributes["REALM"] == "stunner.l7mp.io"
    assert parsed.attributes["NONCE"] == b"nonce"
    assert integrity_ok(parsed, auth.key)
    assert not integrity_ok(parsed, b"another key")


def test_unsigned_message_passes_the_integrity_check() -> None:
    parsed = parse_stun(bytes(build_request(stun.Method.BINDING)))
    assert parsed is not None
    assert integrity_ok(parsed, b"any")


@pytest.mark.parametrize(
    "garbage", [b"", b"\x00" * 19, b"\x00\x01\x00\x08" + b"\x00" * 16, b"\xff" * 40]
)
def test_malformed_stun_parses_to_none(garbage: bytes) -> None:
    assert parse_stun(garbage) is None


def test_error_of_reads_code_and_reason() -> None:
    msg = stun.Message(stun.Method.ALLOCATE, stun.Class.ERROR)
    assert error_of(msg) == (0, "error response without ERROR-CODE")
    msg.attributes["ERROR-CODE"] = (401, "Unauthorized")
    assert error_of(msg) == (401, "Unauthorized")
