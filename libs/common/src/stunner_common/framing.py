"""STUN and ChannelData over a byte stream (TCP, TLS): RFC 8656 §12.5, for servers and clients.

Over a stream every frame announces its length in its first four bytes. A STUN message
(first two bits 00) is its 20-byte header plus the length field; ChannelData (first two bits 01)
is its 4-byte header plus the length field, padded to a multiple of 4 on the wire. Anything else
means the stream is out of sync. These are plain byte arithmetic, with no STUN parsing, because
they sit on the relay's hot path.
"""

from __future__ import annotations

import struct

STUN_HEADER_LENGTH = 20
CHANNEL_HEADER_LENGTH = 4
CHANNEL_HEADER = struct.Struct("!HH")


def stream_frame_length(buf: bytes | bytearray, offset: int = 0) -> int:
    """Bytes the next frame takes on a stream (ChannelData padded); 0 = need more, -1 = bad."""
    if len(buf) - offset < 4:
        return 0
    first = buf[offset]
    length = (buf[offset + 2] << 8) | buf[offset + 3]
    if 0x40 <= first <= 0x7F:
        return 4 + length + (-length % 4)
    if first & 0xC0 == 0:
        return STUN_HEADER_LENGTH + length
    return -1


def is_channel_data(frame: bytes | bytearray) -> bool:
    """ChannelData starts with 0b01 (RFC 8656 §12); STUN with 0b00."""
    return len(frame) >= CHANNEL_HEADER_LENGTH and (frame[0] & 0xC0) == 0x40


def channel_data(channel: int, payload: bytes, *, stream: bool) -> bytes:
    """A ChannelData message; over a stream transport padded to 4 bytes (RFC 8656 §12.5)."""
    frame = CHANNEL_HEADER.pack(channel, len(payload)) + payload
    if stream and len(payload) % 4:
        frame += bytes(-len(payload) % 4)
    return frame


def parse_channel_data(data: bytes) -> tuple[int, bytes] | None:
    """(channel, payload), or None when the frame is short or its length lies."""
    if len(data) < CHANNEL_HEADER_LENGTH:
        return None
    channel, length = CHANNEL_HEADER.unpack_from(data)
    if length > len(data) - CHANNEL_HEADER_LENGTH:
        return None
    return channel, data[CHANNEL_HEADER_LENGTH : CHANNEL_HEADER_LENGTH + length]


class StreamOutOfSyncError(ValueError):
    """The stream carries a frame that is neither STUN nor ChannelData."""


class StreamDeframer:
    """Cuts the bytes of one stream connection into STUN messages and ChannelData frames.

    ChannelData frames are returned without their padding; a partial frame waits for more bytes.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Append ``data``; return every frame now complete. Raises ``StreamOutOfSyncError``."""
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        while (total := stream_frame_length(buf, pos)) > 0:
            if len(buf) - pos < total:
                break
            if buf[pos] & 0xC0 == 0x40:
                length = (buf[pos + 2] << 8) | buf[pos + 3]
                frames.append(bytes(buf[pos : pos + CHANNEL_HEADER_LENGTH + length]))
            else:
                frames.append(bytes(buf[pos : pos + total]))
            pos += total
        if total < 0:
            del buf[:pos]
            raise StreamOutOfSyncError(f"stream out of sync: first bytes {bytes(buf[:2]).hex()}")
        del buf[:pos]
        return frames
