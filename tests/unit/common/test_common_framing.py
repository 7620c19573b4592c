"""STUN and ChannelData framing over streams, shared by stunnerd and turncat (RFC 8656 §12.5)."""

from __future__ import annotations

import pytest
from aioice import stun

from stunner_common.framing import (
    StreamDeframer,
    StreamOutOfSyncError,
    channel_data,
    is_channel_data,
    parse_channel_data,
    stream_frame_length,
)


def test_channel_data_is_padded_to_four_bytes_only_on_streams() -> None:
    assert channel_data(0x4000, b"abc", stream=False) == b"\x40\x00\x00\x03abc"
    assert channel_data(0x4000, b"abc", stream=True) == b"\x40\x00\x00\x03abc\x00"
    assert channel_data(0x4001, b"abcd", stream=True) == b"\x40\x01\x00\x04abcd"
    assert is_channel_data(b"\x40\x00\x00\x00")
    assert not is_channel_data(b"\x00\x01\x00\x00")


def test_stream_deframer_reassembles_frames_split_at_every_byte() -> None:
    request = bytes(stun.Message(stun.Method.BINDING, stun.Class.REQUEST))
    stream = (
        channel_data(0x4000, b"hello", stream=True)
        + request
        + channel_data(0x4000, b"", stream=True)
        + channel_data(0x4002, b"1234", stream=True)
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
    stream = b"".join(channel_data(0x4000, bytes([i]) * i, stream=True) for i in range(50))
    frames = StreamDeframer().feed(stream)
    assert [len(f) - 4 for f in frames] == list(range(50))


def test_stream_deframer_rejects_a_stream_out_of_sync() -> None:
    with pytest.raises(ValueError, match="out of sync"):
        StreamDeframer().feed(b"\xff\xff\x00\x00")


def test_out_of_sync_is_its_own_error_and_a_value_error() -> None:
    with pytest.raises(StreamOutOfSyncError, match="first bytes ffff"):
        StreamDeframer().feed(b"\xff\xff\x00\x00")


def test_a_partial_frame_waits_and_the_deframer_agrees_with_stream_frame_length() -> None:
    frame = channel_data(0x4001, b"abcde", stream=True)
    assert stream_frame_length(frame) == len(frame) == 12
    deframer = StreamDeframer()
    assert deframer.feed(frame[:-1]) == []
    assert deframer.feed(frame[-1:]) == [b"\x40\x01\x00\x05abcde"]
    assert parse_channel_data(b"\x40\x01\x00\x05abcde") == (0x4001, b"abcde")
    assert parse_channel_data(b"\x40\x01\x00\x09abcde") is None
