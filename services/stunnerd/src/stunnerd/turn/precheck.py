"""Cheap checks on a STUN message before anything decodes it: what unauthenticated input costs.

Anyone can send a TURN server a request, so the work done on a request that will be refused must
not grow with what the sender stuffs into it. The engine runs these checks first and decodes a
message fully (aioice) only after its sender proved the credentials:

* `header`: the 20-byte header (RFC 8489 §5): two zero bits, the magic cookie, a length that
  matches the datagram and is a multiple of 4, and a size limit. Constant time.
* `integrity_offset`: where MESSAGE-INTEGRITY sits, found from the tail, since only FINGERPRINT
  may follow it (RFC 8489 §14.5, §14.7). Constant time: a request without it is challenged (401)
  without looking at its attributes at all.
* `scan`: one pass over the attribute headers, stopping past `max_attributes`, keeping only what
  authentication needs (USERNAME, REALM, NONCE and the MESSAGE-INTEGRITY offset) and the unknown
  comprehension-required types; values are sliced, never decoded. It keeps where each attribute
  lies, so that the decode of a request that passes (`codec.decode_scanned`) does not walk again.
* `integrity_ok`: HMAC-SHA1 over the raw bytes (RFC 8489 §14.5), no message object.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass
from typing import NoReturn

from stunnerd.turn.codec import (
    HEADER_LENGTH,
    KNOWN_ATTRIBUTE_TYPES,
    StunBadRequestError,
    StunDecodeError,
)

MAX_ATTRIBUTES = 40
"""Attributes a request may carry; a real TURN client sends fewer than 15."""
MAX_USERNAME_BYTES = 512  # RFC 8489 §14.3: fewer than 509 bytes, with slack for padding
MAX_REALM_BYTES = 763  # RFC 8489 §14.9
MAX_NONCE_BYTES = 763  # RFC 8489 §14.10

_HEADER = struct.Struct("!HHI12s")
_ATTR_HEADER = struct.Struct("!HH")
_MAGIC = b"\x21\x12\xa4\x42"
_MI_HEADER = b"\x00\x08\x00\x14"
_FP_HEADER = b"\x80\x28\x00\x04"
_USERNAME, _REALM, _NONCE, _INTEGRITY, _FINGERPRINT = 0x0006, 0x0014, 0x0015, 0x0008, 0x8028


class MessageTooLargeError(StunDecodeError):
    """A message over the size limit: dropped unread (counted as `message_bytes`)."""


class TooManyAttributesError(StunBadRequestError):
    """A request with more attributes than allowed: a 400 (counted as `attributes`)."""


# Not frozen: one is built per request, and a frozen dataclass's __init__ costs about three
# times a plain one's (object.__setattr__ per field).
@dataclass(slots=True)
class Header:
    msg_type: int
    method: int
    is_request: bool
    transaction_id: bytes


@dataclass(slots=True)  # not frozen, as `Header`
class Scan:
    """What authentication needs from a request, sliced out of the raw bytes."""

    username: bytes | None
    realm: bytes | None
    nonce: bytes | None
    integrity_at: int  # offset of the MESSAGE-INTEGRITY attribute, -1 when absent
    unknown_required: tuple[int, ...]
    spans: list[tuple[int, int, int]]
    """Every attribute walked, in order, as (type, offset, end of value)."""


def header(data: bytes, max_bytes: int) -> Header:
    """The header of a STUN message, or StunDecodeError (drop without answering)."""
    size = len(data)
    if size > max_bytes:
        raise MessageTooLargeError(f"message of {size} bytes exceeds the limit of {max_bytes}")
    if size < HEADER_LENGTH or data[0] & 0xC0 or data[3] & 0x03 or data[4:8] != _MAGIC:
        raise StunDecodeError("not a STUN message")
    msg_type, length, _cookie, tid = _HEADER.unpack_from(data)
    if size != HEADER_LENGTH + length:
        raise StunDecodeError("STUN length does not match the datagram")
    return Header(msg_type, msg_type & 0x3EEF, msg_type & 0x0110 == 0, tid)


def integrity_offset(data: bytes) -> int:
    """Offset of a MESSAGE-INTEGRITY in its only legal place (last, or before FINGERPRINT)."""
    end = len(data)
    if end >= HEADER_LENGTH + 32 and data[end - 8 : end - 4] == _FP_HEADER:
        end -= 8
    at = end - 24
    if at >= HEADER_LENGTH and data[at : at + 4] == _MI_HEADER:
        return at
    return -1


def scan(data: bytes, head: Header, max_attributes: int = MAX_ATTRIBUTES) -> Scan:
    """Walk the attribute headers; StunBadRequestError for a request that is malformed or over
    `max_attributes` (worth a short 400), StunDecodeError for anything else."""
    username = realm = nonce = None  # the first of each counts
    integrity_at = -1
    unknown: list[int] = []
    spans: list[tuple[int, int, int]] = []
    pos, end, count = HEADER_LENGTH, len(data), 0
    while pos + 4 <= end:
        count += 1
        if count > max_attributes:
            _bad(head, f"more than {max_attributes} attributes", TooManyAttributesError)
        attr_type, attr_len = _ATTR_HEADER.unpack_from(data, pos)
        stop = pos + 4 + attr_len
        if stop > end:
            _bad(head, "attribute overruns the message")
        # a FINGERPRINT after MESSAGE-INTEGRITY matches none of the branches below
        if integrity_at >= 0 and attr_type != _FINGERPRINT:
            _bad(head, "only FINGERPRINT may follow MESSAGE-INTEGRITY")
        elif attr_type == _USERNAME and username is None:
            username = _bounded(head, data, pos + 4, stop, MAX_USERNAME_BYTES, "USERNAME")
        elif attr_type == _REALM and realm is None:
            realm = _bounded(head, data, pos + 4, stop, MAX_REALM_BYTES, "REALM")
        elif attr_type == _NONCE and nonce is None:
            nonce = _bounded(head, data, pos + 4, stop, MAX_NONCE_BYTES, "NONCE")
        elif attr_type == _INTEGRITY:
            if attr_len != 20:
                _bad(head, "MESSAGE-INTEGRITY must be 20 bytes")
            integrity_at = pos
        elif attr_type < 0x8000 and attr_type not in KNOWN_ATTRIBUTE_TYPES:
            unknown.append(attr_type)
        spans.append((attr_type, pos, stop))
        pos = stop + (-attr_len % 4)
    if pos != end:
        _bad(head, "trailing bytes after the last attribute")
    return Scan(username, realm, nonce, integrity_at, tuple(unknown), spans)


def integrity_ok(data: bytes, integrity_at: int, key: bytes) -> bool:
    """RFC 8489 §14.5: HMAC-SHA1 over the message up to MESSAGE-INTEGRITY, its length adjusted."""
    if integrity_at < HEADER_LENGTH or data[integrity_at : integrity_at + 4] != _MI_HEADER:
        return False
    length = integrity_at - HEADER_LENGTH + 24
    signed = b"".join((data[:2], length.to_bytes(2, "big"), data[4:integrity_at]))
    digest = hmac.digest(key, signed, "sha1")
    return hmac.compare_digest(digest, data[integrity_at + 4 : integrity_at + 24])


def _bounded(head: Header, data: bytes, start: int, stop: int, limit: int, name: str) -> bytes:
    if stop - start > limit:
        _bad(head, f"{name} longer than {limit} bytes")
    return data[start:stop]


def _bad(
    head: Header, reason: str, error: type[StunBadRequestError] = StunBadRequestError
) -> NoReturn:
    if head.is_request:
        raise error(head.method, head.transaction_id, reason)
    raise StunDecodeError(reason)
