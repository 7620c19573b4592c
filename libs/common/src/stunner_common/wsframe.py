"""WebSocket frames on the wire (RFC 6455 section 5.2), without I/O.

One frame builder serves the CDS's server side (unmasked frames, built once and written to every
watcher) and the CDS client's side (masked frames, as RFC 6455 section 5.3 requires of a client);
``Header`` reads the fixed part of a received frame and says what the peer got wrong.
"""

from __future__ import annotations

import struct
from base64 import b64encode
from dataclasses import dataclass
from hashlib import sha1

__all__ = [
    "BINARY",
    "CLOSE",
    "CONTINUATION",
    "DATA_OPCODES",
    "PING",
    "PONG",
    "TEXT",
    "FrameError",
    "Header",
    "accept_key",
    "close_payload",
    "encode_frame",
    "mask",
    "parse_close",
]

CONTINUATION = 0x0
TEXT = 0x1
BINARY = 0x2
CLOSE = 0x8
PING = 0x9
PONG = 0xA
DATA_OPCODES = frozenset({CONTINUATION, TEXT, BINARY})
_CONTROL_OPCODES = frozenset({CLOSE, PING, PONG})
_MAX_CONTROL_PAYLOAD = 125
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# Close codes a peer may send (RFC 6455 section 7.4.1; 3000-4999 are registered or private).
_VALID_CLOSE_CODES = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013})


class FrameError(Exception):
    """The peer broke the framing rules; ``code`` is the close code to answer with."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def accept_key(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` value a server must answer ``key`` with (section 4.2.2)."""
    return b64encode(sha1(key.encode() + _GUID, usedforsecurity=False).digest()).decode()


def mask(payload: bytes, key: bytes) -> bytes:
    """``payload`` XORed with the 4-byte ``key`` repeated (section 5.3); its own inverse."""
    if not payload:
        return payload
    size = len(payload)
    repeated = (key * (size // 4 + 1))[:size]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(size, "big")


def encode_frame(opcode: int, payload: bytes, mask_key: bytes | None = None) -> bytes:
    """One whole frame (FIN set, no extension): unmasked from a server, masked from a client."""
    size = len(payload)
    first = 0x80 | opcode
    bit = 0x80 if mask_key is not None else 0
    if size < 126:
        header = bytes((first, bit | size))
    elif size < 1 << 16:
        header = struct.pack("!BBH", first, bit | 126, size)
    else:
        header = struct.pack("!BBQ", first, bit | 127, size)
    if mask_key is None:
        return header + payload
    return header + mask_key + mask(payload, mask_key)


@dataclass(frozen=True, slots=True)
class Header:
    """The first two bytes of a frame, checked; ``extra`` more bytes carry a longer length."""

    fin: bool
    opcode: int
    masked: bool
    length: int
    """The 7-bit length: the payload's length below 126, else 126 or 127 (read ``extra`` more)."""

    @property
    def extra(self) -> int:
        return {126: 2, 127: 8}.get(self.length, 0)

    @classmethod
    def parse(cls, head: bytes, *, from_server: bool) -> Header:
        """Check the fixed part of a frame: no reserved bit (no extension was agreed), a known
        opcode, control frames unfragmented and short, and masking as the sender's side needs."""
        first, second = head[0], head[1]
        header = cls(bool(first & 0x80), first & 0x0F, bool(second & 0x80), second & 0x7F)
        if first & 0x70:
            raise FrameError(1002, "a reserved bit is set")
        if header.opcode not in DATA_OPCODES and header.opcode not in _CONTROL_OPCODES:
            raise FrameError(1002, f"unknown opcode {header.opcode:#x}")
        if header.opcode in _CONTROL_OPCODES and (
            not header.fin or header.length > _MAX_CONTROL_PAYLOAD
        ):
            raise FrameError(1002, "a control frame is fragmented or longer than 125 bytes")
        if header.masked == from_server:
            side = "a server's frame is masked" if from_server else "a client's is not masked"
            raise FrameError(1002, side)
        return header

    def payload_length(self, extra: bytes) -> int:
        """The payload's length, from the ``extra`` bytes read after the fixed part."""
        if self.length == 126:
            return int(struct.unpack("!H", extra)[0])
        if self.length == 127:
            return int(struct.unpack("!Q", extra)[0])
        return self.length


def close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's payload: the code, then the reason cut to fit 125 bytes."""
    return struct.pack("!H", code) + reason.encode()[: _MAX_CONTROL_PAYLOAD - 2]


def parse_close(payload: bytes) -> tuple[int, str]:
    """The code and reason of a received close frame (1005: none given)."""
    if not payload:
        return 1005, ""
    if len(payload) == 1:
        raise FrameError(1002, "a close frame with a one-byte payload")
    code = int(struct.unpack("!H", payload[:2])[0])
    if code not in _VALID_CLOSE_CODES and not 3000 <= code <= 4999:
        raise FrameError(1002, f"close code {code} is not one a peer may send")
    try:
        reason = payload[2:].decode()
    except UnicodeDecodeError as exc:
        raise FrameError(1007, "a close reason that is not UTF-8") from exc
    return code, reason
