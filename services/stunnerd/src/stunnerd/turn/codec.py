"""The STUN/TURN wire format: the one module that touches aioice's codec.

aioice 0.13 parses and builds STUN messages (RFC 8489) and knows most TURN attributes, but it
skips unknown attributes silently and lacks a few that a TURN server must recognise
(REQUESTED-ADDRESS-FAMILY, EVEN-PORT, RESERVATION-TOKEN, UNKNOWN-ATTRIBUTES, and the dual
allocation's ADDITIONAL-ADDRESS-FAMILY and ADDRESS-ERROR-CODE). This module keeps its own
attribute tables (aioice's plus those) and never writes into aioice's globals, so
another user of aioice in the process sees aioice as shipped: `decode` adds the extra attributes
to the parsed message itself and `encode` packs from our tables. The raw attribute types are
scanned so that the engine can answer 420 for unknown comprehension-required attributes
(RFC 8489 §7.3.1). ChannelData and stream framing (RFC 8656
§12.5) are `stunner_common.framing`'s, shared with turncat, and re-exported here so the engine
reaches the wire through this one module and never imports aioice directly.
"""

from __future__ import annotations

import binascii
import enum
import hashlib
import hmac
import ipaddress
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aioice import stun

from stunner_common.framing import channel_data as channel_data
from stunner_common.framing import parse_channel_data as parse_channel_data
from stunner_common.framing import stream_frame_length as stream_frame_length

COOKIE = stun.COOKIE
HEADER_LENGTH = stun.HEADER_LENGTH
CHANNEL_MIN = 0x4000
# RFC 8656 §12 narrowed channels to 0x4000-0x4FFF, but RFC 5766 clients (coturn's uclient among
# them) still pick from 0x4000-0x7FFF, and pion accepts that range: so do we.
CHANNEL_MAX = 0x7FFF

Method = stun.Method
Class = stun.Class
Message = stun.Message

_HEADER = struct.Struct("!HHI12s")
_ATTR_HEADER = struct.Struct("!HH")

TRANSPORT_UDP = 17 << 24  # REQUESTED-TRANSPORT carries the protocol number in its top byte
TRANSPORT_TCP = 6 << 24  # RFC 6062 §6.1
FAMILY_IPV4 = 0x01
FAMILY_IPV6 = 0x02


def _pack_attr_types(value: Iterable[int]) -> bytes:
    return b"".join(struct.pack("!H", t) for t in value)


def _unpack_attr_types(data: bytes) -> tuple[int, ...]:
    return tuple(struct.unpack("!H", data[i : i + 2])[0] for i in range(0, len(data) - 1, 2))


def _pack_family(value: int) -> bytes:
    return struct.pack("!B3x", value)


def _unpack_family(data: bytes) -> int:
    if len(data) != 4:
        raise ValueError("REQUESTED-ADDRESS-FAMILY must be 4 bytes")
    return int(data[0])


def _pack_address_error(value: tuple[int, int, str]) -> bytes:
    """ADDRESS-ERROR-CODE (RFC 8656 §18.13): family, then an ERROR-CODE body (class, number)."""
    family, code, reason = value
    return struct.pack("!BBBB", family, 0, code // 100, code % 100) + reason.encode()


def _unpack_address_error(data: bytes) -> tuple[int, int, str]:
    if len(data) < 4:
        raise ValueError("ADDRESS-ERROR-CODE must be at least 4 bytes")
    return int(data[0]), (data[2] & 0x07) * 100 + data[3], data[4:].decode()


def _pack_even_port(value: int) -> bytes:
    return struct.pack("!B", value)


def _unpack_even_port(data: bytes) -> int:
    if len(data) != 1:
        raise ValueError("EVEN-PORT must be 1 byte")
    return int(data[0])


EXTRA_ATTRIBUTES: tuple[stun.AttributeEntry, ...] = (
    (0x000A, "UNKNOWN-ATTRIBUTES", _pack_attr_types, _unpack_attr_types),
    (0x0017, "REQUESTED-ADDRESS-FAMILY", _pack_family, _unpack_family),
    (0x0018, "EVEN-PORT", _pack_even_port, _unpack_even_port),
    (0x0022, "RESERVATION-TOKEN", stun.pack_bytes, stun.unpack_bytes),
    (0x002A, "CONNECTION-ID", stun.pack_unsigned, stun.unpack_unsigned),
    (0x8000, "ADDITIONAL-ADDRESS-FAMILY", _pack_family, _unpack_family),
    (0x8001, "ADDRESS-ERROR-CODE", _pack_address_error, _unpack_address_error),
)
"""The TURN attributes aioice 0.13 lacks, as aioice attribute entries (type, name, pack, unpack)."""

LEGACY_ATTRIBUTES: tuple[stun.AttributeEntry, ...] = (
    (0x8032, "ADDITIONAL-ADDRESS-FAMILY", _pack_family, _unpack_family),
)
"""Decoded but never sent: the codepoint of the dual-allocation draft that coturn 4.6 still
sends for ADDITIONAL-ADDRESS-FAMILY (RFC 8656 assigned 0x8000)."""


class TcpMethod(enum.IntEnum):
    """RFC 6062 §6.2: the TURN-TCP methods, which aioice 0.13's `Method` lacks."""

    CONNECT = 0x000A
    CONNECTION_BIND = 0x000B
    CONNECTION_ATTEMPT = 0x000C


# The extras aioice's parser skips (all of them in 0.13; none if a later aioice knows them).
_EXTRA_BY_TYPE: dict[int, stun.AttributeEntry] = {
    entry[0]: entry
    for entry in EXTRA_ATTRIBUTES + LEGACY_ATTRIBUTES
    if entry[0] not in stun.ATTRIBUTES_BY_TYPE
}
ATTRIBUTES_BY_NAME: dict[str, stun.AttributeEntry] = {
    **{entry[1]: entry for entry in EXTRA_ATTRIBUTES},
    **stun.ATTRIBUTES_BY_NAME,
}
KNOWN_ATTRIBUTE_TYPES = frozenset(stun.ATTRIBUTES_BY_TYPE) | frozenset(_EXTRA_BY_TYPE)
_KNOWN_METHODS = frozenset(int(m) for m in Method) | frozenset(int(m) for m in TcpMethod)


class StunDecodeError(ValueError):
    """The bytes are not a STUN message we can answer (the caller drops them)."""


class StunBadRequestError(ValueError):
    """A well-framed STUN request whose content is malformed: worth a 400 answer."""

    def __init__(self, method: int, transaction_id: bytes, reason: str) -> None:
        super().__init__(reason)
        self.method = method
        self.transaction_id = transaction_id


@dataclass(frozen=True, slots=True)
class Decoded:
    """A parsed STUN message plus the comprehension-required attribute types we do not know."""

    message: Message
    unknown_required: tuple[int, ...]
    peers: tuple[tuple[str, int], ...]  # every XOR-PEER-ADDRESS before MESSAGE-INTEGRITY


def looks_like_stun(data: bytes) -> bool:
    """RFC 8489 §6: two zero bits, a length that is a multiple of 4, the magic cookie."""
    return (
        len(data) >= HEADER_LENGTH
        and data[0] & 0xC0 == 0
        and data[3] & 0x03 == 0
        and data[4:8] == b"\x21\x12\xa4\x42"
    )


def decode(data: bytes) -> Decoded:
    """Parse one STUN message. Raises StunDecodeError (drop) or StunBadRequestError (answer 400)."""
    if not looks_like_stun(data):
        raise StunDecodeError("not a STUN message")
    msg_type, length, _cookie, tid = _HEADER.unpack_from(data)
    if len(data) != HEADER_LENGTH + length:
        raise StunDecodeError("STUN length does not match the datagram")
    method = msg_type & 0x3EEF
    is_request = msg_type & 0x0110 == 0
    unknown: list[int] = []
    peers: list[tuple[str, int]] = []
    extras: list[tuple[stun.AttributeEntry, bytes]] = []
    integrity_seen = False
    pos = HEADER_LENGTH
    end = len(data)
    while pos + 4 <= end:
        attr_type, attr_len = _ATTR_HEADER.unpack_from(data, pos)
        if pos + 4 + attr_len > end:
            if is_request:
                raise StunBadRequestError(method, tid, "attribute overruns the message")
            raise StunDecodeError("attribute overruns the message")
        if integrity_seen:
            pass  # attributes after MESSAGE-INTEGRITY are ignored (RFC 8489 §14.5)
        elif attr_type < 0x8000 and attr_type not in KNOWN_ATTRIBUTE_TYPES:
            unknown.append(attr_type)
        elif attr_type == 0x0012:
            try:
                ip, port = stun.unpack_xor_address(data[pos + 4 : pos + 4 + attr_len], tid)
            except ValueError as exc:
                if is_request:
                    raise StunBadRequestError(method, tid, f"bad XOR-PEER-ADDRESS: {exc}") from exc
                raise StunDecodeError(str(exc)) from exc
            peers.append((ip, port))
        elif attr_type == 0x0008:
            integrity_seen = True
        elif attr_type in _EXTRA_BY_TYPE:
            extras.append((_EXTRA_BY_TYPE[attr_type], data[pos + 4 : pos + 4 + attr_len]))
        pos += 4 + attr_len + (-attr_len % 4)
    if method not in _KNOWN_METHODS:
        if is_request:
            raise StunBadRequestError(method, tid, "unknown method")
        raise StunDecodeError("unknown method")
    try:
        if method in _TCP_METHODS:
            message = _parse_tcp_message(data, method, tid)
        else:
            message = stun.parse_message(data)
        for (_, name, _, unpack_value), value in extras:
            message.attributes[name] = unpack_value(value)
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
        if is_request:
            raise StunBadRequestError(method, tid, f"malformed attribute: {exc}") from exc
        raise StunDecodeError(str(exc)) from exc
    return Decoded(message, tuple(unknown), tuple(peers))


_TCP_METHODS = frozenset(int(m) for m in TcpMethod)


def _parse_tcp_message(data: bytes, method: int, tid: bytes) -> Message:
    """aioice's parser refuses methods it does not know, so RFC 6062 messages are parsed here
    with its attribute table (extras are added by the caller, as for every message)."""
    attributes: dict[str, Any] = {}
    integrity_data: bytes | None = None
    pos, end = HEADER_LENGTH, len(data)
    while pos + 4 <= end:
        attr_type, attr_len = _ATTR_HEADER.unpack_from(data, pos)
        value = data[pos + 4 : pos + 4 + attr_len]
        entry = stun.ATTRIBUTES_BY_TYPE.get(attr_type)
        if entry is not None and (integrity_data is None or attr_type == 0x8028):
            _, name, _, unpack_value = entry
            if unpack_value is stun.unpack_xor_address:
                attributes[name] = stun.unpack_xor_address(value, transaction_id=tid)
            else:
                attributes[name] = unpack_value(value)
            if attr_type == 0x8028:
                if attributes[name] != stun.message_fingerprint(data[:pos]):
                    raise ValueError("STUN message fingerprint does not match")
            elif attr_type == 0x0008:
                integrity_data = data[:pos]
        pos += 4 + attr_len + (-attr_len % 4)
    message = Message(
        message_method=method,  # type: ignore[arg-type]  # an RFC 6062 method, not in aioice's enum
        message_class=Class(int.from_bytes(data[:2], "big") & 0x0110),
        transaction_id=tid,
        attributes=attributes,
    )
    message._integrity_data = integrity_data
    return message


_ATTR_MI = b"\x00\x08\x00\x14"
_ATTR_FP = b"\x80\x28\x00\x04"
_U32 = struct.Struct("!I").pack
_ADDR_CACHE_MAX = 4096
_packed_ips: dict[str, bytes] = {}


def _packed_ip(ip: str) -> bytes:
    packed = _packed_ips.get(ip)
    if packed is None:
        packed = ipaddress.ip_address(ip).packed
        if len(_packed_ips) >= _ADDR_CACHE_MAX:
            _packed_ips.clear()
        _packed_ips[ip] = packed
    return packed


def pack_xor_address(value: tuple[str, int], transaction_id: bytes) -> bytes:
    """XOR-*-ADDRESS (RFC 8489 §14.2) with integer XOR; aioice XORs byte by byte."""
    packed = _packed_ip(value[0])
    port = value[1] ^ (COOKIE >> 16)
    if len(packed) == 4:
        return struct.pack("!BBHI", 0, 1, port, int.from_bytes(packed, "big") ^ COOKIE)
    mask = int.from_bytes(COOKIE.to_bytes(4, "big") + transaction_id, "big")
    return struct.pack("!BBH", 0, 2, port) + (int.from_bytes(packed, "big") ^ mask).to_bytes(
        16, "big"
    )


def encode(
    method: int,
    klass: Class,
    transaction_id: bytes,
    attributes: Mapping[str, Any] | Sequence[tuple[str, Any]],
    *,
    key: bytes | None = None,
    software: str | None = None,
) -> bytes:
    """Build a message; with `key`, MESSAGE-INTEGRITY; always FINGERPRINT (RFC 8489 §14.5, §14.7).

    Attribute values are packed with aioice's table, but the message is serialised once, instead
    of once per trailing attribute as `aioice.stun.Message` does. A sequence of (name, value)
    pairs may repeat a name (a dual allocation's two XOR-RELAYED-ADDRESS, RFC 8656 §7.2).
    """
    body = bytearray()
    items = list(attributes.items()) if isinstance(attributes, Mapping) else list(attributes)
    if software:
        items.append(("SOFTWARE", software))
    for name, value in items:
        attr_type, _, pack_value, _ = ATTRIBUTES_BY_NAME[name]
        if pack_value is stun.pack_xor_address:
            packed = pack_xor_address(value, transaction_id)
        else:
            packed = pack_value(value)
        body += _ATTR_HEADER.pack(attr_type, len(packed))
        body += packed
        if len(packed) % 4:
            body += bytes(-len(packed) % 4)
    msg_type = method | klass
    if key is not None:
        header = _HEADER.pack(msg_type, len(body) + 24, COOKIE, transaction_id)
        body += _ATTR_MI + hmac.new(key, header + body, hashlib.sha1).digest()
    header = _HEADER.pack(msg_type, len(body) + 8, COOKIE, transaction_id)
    crc = binascii.crc32(header + body) ^ stun.FINGERPRINT_XOR
    return header + bytes(body) + _ATTR_FP + _U32(crc)


_SEND_INDICATION_TYPE = 0x0016
_DATA_INDICATION_TYPE = 0x0017
_MAGIC = b"\x21\x12\xa4\x42"
_PORT_XOR = COOKIE >> 16
_peer_by_xor: dict[bytes, tuple[str, int]] = {}
_xor_peer_attr: dict[tuple[str, int], bytes] = {}


def _remember(table: dict[Any, Any], key: Any, value: Any) -> None:
    if len(table) >= _ADDR_CACHE_MAX:
        table.clear()
    table[key] = value


def parse_send_indication(data: bytes) -> tuple[tuple[str, int], bytes] | None:
    """The peer and payload of a plain IPv4 Send indication (RFC 8656 §10.2), parsed by hand.

    This is the relay path for clients that use Send/Data indications instead of channels, so it
    avoids a full decode. Anything unusual (IPv6, several peers, an unknown comprehension-required
    attribute, a bad fingerprint, odd framing) returns None and the caller decodes it fully.
    """
    end = len(data)
    if (
        end < HEADER_LENGTH
        or data[0] != 0
        or data[1] != _SEND_INDICATION_TYPE
        or data[4:8] != _MAGIC
        or (data[2] << 8 | data[3]) != end - 20
    ):
        return None
    pos = HEADER_LENGTH
    peer: tuple[str, int] | None = None
    payload: bytes | None = None
    while pos + 4 <= end:
        attr_type, attr_len = _ATTR_HEADER.unpack_from(data, pos)
        stop = pos + 4 + attr_len
        if stop > end:
            return None
        if attr_type == 0x0012:
            if peer is not None or attr_len != 8 or data[pos + 5] != 1:
                return None
            raw = data[pos + 4 : stop]
            peer = _peer_by_xor.get(raw)
            if peer is None:
                ip = (int.from_bytes(raw[4:8], "big") ^ COOKIE).to_bytes(4, "big")
                port = ((raw[2] << 8) | raw[3]) ^ _PORT_XOR
                peer = (f"{ip[0]}.{ip[1]}.{ip[2]}.{ip[3]}", port)
                _remember(_peer_by_xor, raw, peer)
        elif attr_type == 0x0013:
            payload = data[pos + 4 : stop]
        elif attr_type == 0x8028:
            if attr_len != 4 or stop != end:
                return None
            if binascii.crc32(data[:pos]) ^ stun.FINGERPRINT_XOR != int.from_bytes(
                data[pos + 4 : stop], "big"
            ):
                return None
        elif attr_type < 0x8000 or attr_type in KNOWN_ATTRIBUTE_TYPES:
            return None  # anything else that matters: let the full decoder judge it
        pos = stop + (-attr_len % 4)
    if peer is None or payload is None or pos != end:
        return None
    return peer, payload


def data_indication(peer: tuple[str, int], payload: bytes, transaction_id: bytes) -> bytes:
    """A Data indication (RFC 8656 §10.3) with XOR-PEER-ADDRESS, DATA and FINGERPRINT."""
    attr = _xor_peer_attr.get(peer)
    if attr is None:
        packed = pack_xor_address(peer, transaction_id)
        attr = _ATTR_HEADER.pack(0x0012, len(packed)) + packed
        if len(packed) == 8:  # IPv4 does not depend on the transaction id: reuse it
            _remember(_xor_peer_attr, peer, attr)
    n = len(payload)
    pad = -n % 4
    header = _HEADER.pack(
        _DATA_INDICATION_TYPE, len(attr) + 4 + n + pad + 8, COOKIE, transaction_id
    )
    message = b"".join((header, attr, _ATTR_HEADER.pack(0x0013, n), payload, bytes(pad)))
    return message + _ATTR_FP + _U32(binascii.crc32(message) ^ stun.FINGERPRINT_XOR)


def error_response(
    method: int,
    transaction_id: bytes,
    code: int,
    reason: str,
    *,
    extra: dict[str, Any] | None = None,
    key: bytes | None = None,
    software: str | None = None,
) -> bytes:
    attrs: dict[str, Any] = {"ERROR-CODE": (code, reason)}
    if extra:
        attrs.update(extra)
    return encode(method, Class.ERROR, transaction_id, attrs, key=key, software=software)


def check_integrity(message: Message, key: bytes) -> bool:
    return bool(message.check_message_integrity(key))
