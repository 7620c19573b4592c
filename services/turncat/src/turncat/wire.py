"""TURN client messages and framing, as pure functions over bytes.

This is the one module that touches aioice's STUN codec (`aioice.stun`), so the rest of turncat
deals in our own small types. It builds the requests a TURN client sends (RFC 8656 §7, §9, §11,
§12), signs them with the long-term credential (RFC 8489 §9.2), cuts a stream transport's bytes
back into STUN messages and ChannelData frames (RFC 8656 §12.5), and keeps the ChannelData hot
path free of STUN parsing: a 4-byte header in front of the payload, nothing more.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from aioice import stun

from stunner_common.auth import long_term_key

Method = stun.Method
Class = stun.Class
Message = stun.Message

CHANNEL_MIN = 0x4000
CHANNEL_MAX = 0x4FFF
REQUESTED_TRANSPORT_UDP = 17 << 24  # RFC 8656 §14.7: protocol number in the first octet
STUN_HEADER_LEN = 20
CHANNEL_HEADER_LEN = 4
MAX_FRAME_LEN = 0xFFFF + STUN_HEADER_LEN

_HEADER = struct.Struct("!HH")


@dataclass(frozen=True, slots=True)
class LongTermAuth:
    """What a credentialed request carries: the names and the HMAC key of RFC 8489 §9.2.2."""

    username: str
    realm: str
    nonce: bytes
    key: bytes

    @classmethod
    def derive(cls, username: str, password: str, realm: str, nonce: bytes) -> LongTermAuth:
        return cls(username, realm, nonce, long_term_key(username, realm, password))


def build_request(
    method: Method,
    attributes: dict[str, Any] | None = None,
    auth: LongTermAuth | None = None,
) -> Message:
    """A request with `attributes`; signed and fingerprinted when `auth` is given."""
    msg = Message(method, Class.REQUEST, attributes=dict(attributes or {}))
    if auth is not None:
        msg.attributes["USERNAME"] = auth.username
        msg.attributes["REALM"] = auth.realm
        msg.attributes["NONCE"] = auth.nonce
        msg.add_message_integrity(auth.key)
    else:
        msg.add_fingerprint()
    return msg


def parse_stun(data: bytes) -> Message | None:
    """Decode a STUN message, or None for anything malformed (the caller drops it)."""
    try:
        return stun.parse_message(data)
    except (ValueError, struct.error, IndexError):
        return None


def integrity_ok(msg: Message, key: bytes) -> bool:
    """False only when the message carries MESSAGE-INTEGRITY and it does not match `key`."""
    if "MESSAGE-INTEGRITY" not in msg.attributes:
        return True
    return msg.check_message_integrity(key)


def error_of(msg: Message) -> tuple[int, str]:
    """The ERROR-CODE of an error response as (code, reason)."""
    value = msg.attributes.get("ERROR-CODE")
    if value is None:
        return 0, "error response without ERROR-CODE"
    return int(value[0]), str(value[1])


def is_channel_data(frame: bytes) -> bool:
    """ChannelData starts with 0b01 (RFC 8656 §12); STUN with 0b00."""
    return len(frame) >= CHANNEL_HEADER_LEN and (frame[0] & 0xC0) == 0x40


def channel_header(channel: int, length: int) -> bytes:
    return _HEADER.pack(channel, length)


def channel_frame(channel: int, payload: bytes, *, pad: bool) -> bytes:
    """A ChannelData message; padded to 4 bytes on stream transports (RFC 8656 §12.5)."""
    frame = _HEADER.pack(channel, len(payload)) + payload
    if pad and len(payload) % 4:
        frame += bytes(4 - len(payload) % 4)
    return frame


class StreamDeframer:
    """Cuts the byte stream of a TCP or TLS connection into STUN and ChannelData frames.

    Each frame's length is known from its first four bytes: a STUN message is its 20-byte header
    plus the length field; ChannelData is 4 bytes plus the length rounded up to 4 (RFC 8656
    §12.5). ChannelData frames are returned without their padding.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= CHANNEL_HEADER_LEN:
            first, length = _HEADER.unpack_from(buf, pos)
            if first & 0xC000 == 0x4000:
                total = CHANNEL_HEADER_LEN + length + (-length % 4)
                if end - pos < total:
                    break
                frames.append(bytes(buf[pos : pos + CHANNEL_HEADER_LEN + length]))
            elif first & 0xC000 == 0:
                total = STUN_HEADER_LEN + length
                if end - pos < total:
                    break
                frames.append(bytes(buf[pos : pos + total]))
            else:
                raise ValueError(f"stream out of sync: first bytes {first:#06x}")
            pos += total
        del buf[:pos]
        return frames
