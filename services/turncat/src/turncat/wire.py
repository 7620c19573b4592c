"""TURN client messages and framing, as pure functions over bytes.

This is the one module that touches aioice's STUN codec (`aioice.stun`), so the rest of turncat
deals in our own small types. aioice 0.13 knows neither the TCP relay methods of RFC 6062
(Connect, ConnectionBind, ConnectionAttempt) nor the attributes CONNECTION-ID (RFC 6062 §6.2.1)
and REQUESTED-ADDRESS-FAMILY (RFC 8656 §18.11), and its parser rejects unknown methods; so the
message envelope (header, MESSAGE-INTEGRITY, FINGERPRINT) is built and parsed here, with
aioice's per-attribute packers plus our extras, and aioice's globals are left as shipped.
ChannelData and stream framing (RFC 8656 §12.5) are `stunner_common.framing`'s, shared with
stunnerd.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from aioice import stun

from stunner_common.auth import long_term_key

Class = stun.Class

CHANNEL_MIN = 0x4000
CHANNEL_MAX = 0x4FFF
REQUESTED_TRANSPORT_UDP = 17 << 24  # RFC 8656 §14.7: protocol number in the first octet
REQUESTED_TRANSPORT_TCP = 6 << 24  # RFC 6062 §6.1
FAMILY_IPV4 = 0x01  # RFC 8656 §18.11
FAMILY_IPV6 = 0x02

_HEADER = struct.Struct("!HHI12s")
_ATTR_HEADER = struct.Struct("!HH")


class Method(enum.IntEnum):
    """STUN/TURN methods (RFC 8656 §17) and the TCP relay ones (RFC 6062 §6.1)."""

    BINDING = 0x1
    ALLOCATE = 0x3
    REFRESH = 0x4
    SEND = 0x6
    DATA = 0x7
    CREATE_PERMISSION = 0x8
    CHANNEL_BIND = 0x9
    CONNECT = 0xA
    CONNECTION_BIND = 0xB
    CONNECTION_ATTEMPT = 0xC


def _pack_family(value: int) -> bytes:
    return struct.pack("!B3x", value)


def _unpack_family(data: bytes) -> int:
    return int(data[0])


_EXTRA_ATTRIBUTES: tuple[stun.AttributeEntry, ...] = (
    (0x0017, "REQUESTED-ADDRESS-FAMILY", _pack_family, _unpack_family),
    (0x002A, "CONNECTION-ID", stun.pack_unsigned, stun.unpack_unsigned),
)
_BY_NAME: dict[str, stun.AttributeEntry] = {
    **{entry[1]: entry for entry in _EXTRA_ATTRIBUTES},
    **stun.ATTRIBUTES_BY_NAME,
}
_BY_TYPE: dict[int, stun.AttributeEntry] = {
    **{entry[0]: entry for entry in _EXTRA_ATTRIBUTES},
    **stun.ATTRIBUTES_BY_TYPE,
}


@dataclass(slots=True)
class Message:
    """A STUN message: method (a `Method`, or the raw number of one we do not know), class,
    transaction id and attributes by name. `integrity_data` is what MESSAGE-INTEGRITY covers."""

    message_method: Method | int
    message_class: Class
    transaction_id: bytes = field(default_factory=lambda: os.urandom(12))
    attributes: dict[str, Any] = field(default_factory=dict)
    integrity_data: bytes | None = None
    raw: bytes | None = field(default=None, repr=False)
    """The bytes the message was parsed from (or built as), sent as they are."""

    @property
    def method_name(self) -> str:
        m = self.message_method
        return m.name if isinstance(m, Method) else f"method {m:#x}"

    def check_message_integrity(self, key: bytes) -> bool:
        if self.integrity_data is None or "MESSAGE-INTEGRITY" not in self.attributes:
            return False
        expected = stun.message_integrity(self.integrity_data, key)
        return hmac.compare_digest(self.attributes["MESSAGE-INTEGRITY"], expected)

    def __bytes__(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return encode(self.message_method, self.message_class, self.transaction_id, self.attributes)


def _pack_attributes(attributes: dict[str, Any], transaction_id: bytes) -> bytes:
    body = bytearray()
    for name, value in attributes.items():
        attr_type, _, pack, _ = _BY_NAME[name]
        packed = pack(value, transaction_id) if pack is stun.pack_xor_address else pack(value)
        body += _ATTR_HEADER.pack(attr_type, len(packed)) + packed
        body += bytes(-len(packed) % 4)
    return bytes(body)


def encode(
    method: int,
    klass: Class,
    transaction_id: bytes,
    attributes: dict[str, Any],
    *,
    key: bytes | None = None,
) -> bytes:
    """A message with `attributes`; with `key`, MESSAGE-INTEGRITY (RFC 8489 §14.5); always
    FINGERPRINT (§14.7). MESSAGE-INTEGRITY and FINGERPRINT in `attributes` are left out."""
    body = _pack_attributes(
        {k: v for k, v in attributes.items() if k not in ("MESSAGE-INTEGRITY", "FINGERPRINT")},
        transaction_id,
    )
    head = _HEADER.pack(method | klass, len(body), stun.COOKIE, transaction_id)
    data = head + body
    if key is not None:
        data += _pack_attributes(
            {"MESSAGE-INTEGRITY": stun.message_integrity(data, key)}, transaction_id
        )
    data += _pack_attributes({"FINGERPRINT": stun.message_fingerprint(data)}, transaction_id)
    return data[:2] + struct.pack("!H", len(data) - stun.HEADER_LENGTH) + data[4:]


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
    attrs = dict(attributes or {})
    if auth is not None:
        attrs["USERNAME"] = auth.username
        attrs["REALM"] = auth.realm
        attrs["NONCE"] = auth.nonce
    wire = encode(method, Class.REQUEST, os.urandom(12), attrs, key=auth.key if auth else None)
    parsed = parse_stun(wire)
    assert parsed is not None  # we just built it
    return parsed


def parse_stun(data: bytes) -> Message | None:
    """Decode a STUN message, or None for anything malformed (the caller drops it).

    Attributes after MESSAGE-INTEGRITY other than FINGERPRINT are ignored (RFC 8489 §14.5), and
    a FINGERPRINT that does not match rejects the message.
    """
    try:
        return _parse(data)
    except (ValueError, struct.error, IndexError, UnicodeDecodeError):
        return None


def _parse(data: bytes) -> Message:
    if len(data) < stun.HEADER_LENGTH:
        raise ValueError("short message")
    msg_type, length, cookie, tid = _HEADER.unpack_from(data)
    if msg_type & 0xC000 or cookie != stun.COOKIE or len(data) != stun.HEADER_LENGTH + length:
        raise ValueError("not a STUN message")
    method_no = msg_type & 0x3EEF
    method: Method | int = (
        Method(method_no) if method_no in Method._value2member_map_ else method_no
    )
    attributes: dict[str, Any] = {}
    integrity_data: bytes | None = None
    pos = stun.HEADER_LENGTH
    while pos <= len(data) - 4:
        attr_type, attr_len = _ATTR_HEADER.unpack_from(data, pos)
        value = data[pos + 4 : pos + 4 + attr_len]
        if len(value) != attr_len:
            raise ValueError("truncated attribute")
        entry = _BY_TYPE.get(attr_type)
        if entry is not None:
            _, name, _, unpack = entry
            if integrity_data is None or name == "FINGERPRINT":
                if unpack is stun.unpack_xor_address:
                    attributes[name] = unpack(value, transaction_id=tid)
                else:
                    attributes[name] = unpack(value)
                if name == "FINGERPRINT":
                    if attributes[name] != stun.message_fingerprint(data[:pos]):
                        raise ValueError("fingerprint mismatch")
                elif name == "MESSAGE-INTEGRITY":
                    integrity_data = data[:pos]
        pos += 4 + attr_len + (-attr_len % 4)
    return Message(method, Class(msg_type & 0x0110), tid, attributes, integrity_data, data)


def stun_frame_length(header: bytes) -> int:
    """The length of the whole STUN message whose first 20 bytes are `header` (for reading one
    message off a stream, as on an RFC 6062 data connection before ConnectionBind succeeds)."""
    return stun.HEADER_LENGTH + int(struct.unpack_from("!H", header, 2)[0])


def integrity_ok(msg: Message, key: bytes) -> bool:
    """False only when the message carries MESSAGE-INTEGRITY and it does not match `key`."""
    if "MESSAGE-INTEGRITY" not in msg.attributes:
        return True
    return msg.check_message_integrity(key)


def error_of(msg: Message | stun.Message) -> tuple[int, str]:
    """The ERROR-CODE of an error response as (code, reason)."""
    value = msg.attributes.get("ERROR-CODE")
    if value is None:
        return 0, "error response without ERROR-CODE"
    return int(value[0]), str(value[1])


def address_family(host: str) -> int:
    """FAMILY_IPV4 or FAMILY_IPV6 for a literal IP address."""
    return FAMILY_IPV6 if ipaddress.ip_address(host).version == 6 else FAMILY_IPV4
