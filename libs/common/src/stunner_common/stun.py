"""The STUN/TURN wire format, for stunnerd and turncat: the one module that imports aioice.

aioice 0.13 packs and unpacks STUN attributes (RFC 8489) and most TURN ones (RFC 8656), but it
lacks a few that both ends of a TURN relay need (REQUESTED-ADDRESS-FAMILY, EVEN-PORT,
RESERVATION-TOKEN, UNKNOWN-ATTRIBUTES, CONNECTION-ID, the dual allocation's
ADDITIONAL-ADDRESS-FAMILY and ADDRESS-ERROR-CODE), knows none of the RFC 6062 methods and skips
unknown attributes silently. So the message envelope (header, MESSAGE-INTEGRITY, FINGERPRINT) is
parsed and built here, in one pass, with aioice's per-attribute packers plus our own table of
extras; aioice's globals are left as shipped, so another user of aioice in the process sees it
unchanged. ChannelData and stream framing (RFC 8656 §12.5) are `stunner_common.framing`'s.
"""

from __future__ import annotations

import binascii
import enum
import hmac
import importlib
import importlib.util
import ipaddress
import os
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any


def _aioice_stun() -> ModuleType:
    """`aioice.stun` without running `aioice/__init__`, which imports aioice's ICE stack
    (dnspython, ifaddr, about 7 MiB) that a codec does not need.

    The package is registered without its body; the body runs the first time anything else asks
    the package for a name (`from aioice import Connection`, `aioice.__version__`), so another
    user of aioice in the process sees the package as shipped. Submodules (`aioice.ice`,
    `aioice.turn`) import as usual either way."""
    if "aioice" not in sys.modules:
        spec = importlib.util.find_spec("aioice")
        if spec is not None and spec.loader is not None:
            package = importlib.util.module_from_spec(spec)
            loader = spec.loader

            def complete(name: str) -> Any:
                # A submodule being imported (`from . import mdns` in `aioice.ice`) or a probe
                # of a dunder is not a name of the body: the import system goes on without it.
                if (name.startswith("__") and name not in ("__all__", "__version__")) or (
                    importlib.util.find_spec(f"aioice.{name}") is not None
                ):
                    raise AttributeError(name)
                del package.__dict__["__getattr__"]
                loader.exec_module(package)
                return getattr(package, name)

            package.__dict__["__getattr__"] = complete
            sys.modules["aioice"] = package
    return importlib.import_module("aioice.stun")


if TYPE_CHECKING:
    from aioice import stun as _aioice
else:
    _aioice = _aioice_stun()

COOKIE = _aioice.COOKIE
HEADER_LENGTH = _aioice.HEADER_LENGTH
FINGERPRINT_XOR = _aioice.FINGERPRINT_XOR
MAGIC = b"\x21\x12\xa4\x42"  # the cookie as it is on the wire (RFC 8489 §5)
CHANNEL_MIN = 0x4000  # RFC 8656 §12: channel numbers 0x4000-0x4FFF
CHANNEL_MAX = 0x4FFF
TRANSPORT_UDP = 17 << 24  # REQUESTED-TRANSPORT: the protocol number in the first octet (§18.8)
TRANSPORT_TCP = 6 << 24  # RFC 6062 §6.1
FAMILY_IPV4 = 0x01  # RFC 8656 §18.11
FAMILY_IPV6 = 0x02

ATTR_XOR_PEER_ADDRESS = 0x0012
ATTR_DATA = 0x0013
ATTR_MESSAGE_INTEGRITY = 0x0008
ATTR_FINGERPRINT = 0x8028

HEADER = struct.Struct("!HHI12s")
ATTR_HEADER = struct.Struct("!HH")
_U32 = struct.Struct("!I").pack
_MI_HEADER = b"\x00\x08\x00\x14"
_FP_HEADER = b"\x80\x28\x00\x04"

Address = tuple[str, int]
AttributeEntry = _aioice.AttributeEntry
Class = _aioice.Class


class Method(enum.IntEnum):
    """STUN/TURN methods (RFC 8489 §18.2, RFC 8656 §17) and the TCP relay ones (RFC 6062 §6.1)."""

    BINDING = 0x1
    SHARED_SECRET = 0x2
    ALLOCATE = 0x3
    REFRESH = 0x4
    SEND = 0x6
    DATA = 0x7
    CREATE_PERMISSION = 0x8
    CHANNEL_BIND = 0x9
    CONNECT = 0xA
    CONNECTION_BIND = 0xB
    CONNECTION_ATTEMPT = 0xC


TCP_METHODS = frozenset({Method.CONNECT, Method.CONNECTION_BIND, Method.CONNECTION_ATTEMPT})
KNOWN_METHODS = frozenset(int(m) for m in Method)
_METHOD_BY_NUMBER: dict[int, Method] = {int(m): m for m in Method}  # faster than Method(n)
_CLASS_BY_BITS: dict[int, Class] = {int(c): c for c in Class}


# -- the attributes aioice lacks -------------------------------------------------------------


def _pack_attr_types(value: Iterable[int]) -> bytes:
    return b"".join(struct.pack("!H", t) for t in value)


def _unpack_attr_types(data: bytes) -> tuple[int, ...]:
    return tuple(struct.unpack("!H", data[i : i + 2])[0] for i in range(0, len(data) - 1, 2))


def _one_octet(name: str, size: int) -> tuple[Callable[[int], bytes], Callable[[bytes], int]]:
    """Pack and unpack of an attribute whose value is its first octet, in `size` bytes."""
    unit = "byte" if size == 1 else "bytes"

    def pack(value: int) -> bytes:
        return struct.pack("!B", value) + bytes(size - 1)

    def unpack(data: bytes) -> int:
        if len(data) != size:
            raise ValueError(f"{name} must be {size} {unit}")
        return int(data[0])

    return pack, unpack


# RFC 8656 §18.11 (and ADDITIONAL-ADDRESS-FAMILY, §18.12): family, then 3 reserved bytes
_pack_family, _unpack_family = _one_octet("REQUESTED-ADDRESS-FAMILY", 4)
_pack_even_port, _unpack_even_port = _one_octet("EVEN-PORT", 1)  # RFC 8656 §18.10: R bit


def _pack_address_error(value: tuple[int, int, str]) -> bytes:
    """ADDRESS-ERROR-CODE (RFC 8656 §18.13): family, then an ERROR-CODE body (class, number)."""
    family, code, reason = value
    return struct.pack("!BBBB", family, 0, code // 100, code % 100) + reason.encode()


def _unpack_address_error(data: bytes) -> tuple[int, int, str]:
    if len(data) < 4:
        raise ValueError("ADDRESS-ERROR-CODE must be at least 4 bytes")
    return int(data[0]), (data[2] & 0x07) * 100 + data[3], data[4:].decode()


EXTRA_ATTRIBUTES: tuple[AttributeEntry, ...] = (
    (0x000A, "UNKNOWN-ATTRIBUTES", _pack_attr_types, _unpack_attr_types),
    (0x0017, "REQUESTED-ADDRESS-FAMILY", _pack_family, _unpack_family),
    (0x0018, "EVEN-PORT", _pack_even_port, _unpack_even_port),
    (0x0022, "RESERVATION-TOKEN", _aioice.pack_bytes, _aioice.unpack_bytes),
    (0x002A, "CONNECTION-ID", _aioice.pack_unsigned, _aioice.unpack_unsigned),
    (0x8000, "ADDITIONAL-ADDRESS-FAMILY", _pack_family, _unpack_family),
    (0x8001, "ADDRESS-ERROR-CODE", _pack_address_error, _unpack_address_error),
)
"""The TURN attributes aioice 0.13 lacks, as aioice attribute entries (type, name, pack, unpack)."""

LEGACY_ATTRIBUTES: tuple[AttributeEntry, ...] = (
    (0x8032, "ADDITIONAL-ADDRESS-FAMILY", _pack_family, _unpack_family),
)
"""Decoded but never sent: the codepoint of the dual-allocation draft that coturn 4.6 still
sends for ADDITIONAL-ADDRESS-FAMILY (RFC 8656 assigned 0x8000)."""

ATTRIBUTES_BY_NAME: dict[str, AttributeEntry] = {
    **{entry[1]: entry for entry in EXTRA_ATTRIBUTES},
    **_aioice.ATTRIBUTES_BY_NAME,
}
ATTRIBUTES_BY_TYPE: dict[int, AttributeEntry] = {
    **{entry[0]: entry for entry in EXTRA_ATTRIBUTES + LEGACY_ATTRIBUTES},
    **_aioice.ATTRIBUTES_BY_TYPE,
}
KNOWN_ATTRIBUTE_TYPES = frozenset(ATTRIBUTES_BY_TYPE)


# -- addresses -------------------------------------------------------------------------------

_PORT_XOR = COOKIE >> 16
_ADDR_CACHE_MAX = 4096
_packed_ips: dict[str, bytes] = {}
_ipv4_by_xor: dict[bytes, Address] = {}


def remember(table: dict[Any, Any], key: Any, value: Any) -> None:
    """Store in a bounded cache of wire forms (cleared when full: peers are few and stable)."""
    if len(table) >= _ADDR_CACHE_MAX:
        table.clear()
    table[key] = value


def _packed_ip(ip: str) -> bytes:
    packed = _packed_ips.get(ip)
    if packed is None:
        packed = ipaddress.ip_address(ip).packed
        remember(_packed_ips, ip, packed)
    return packed


def pack_xor_address(value: Address, transaction_id: bytes) -> bytes:
    """XOR-*-ADDRESS (RFC 8489 §14.2) with integer XOR; aioice XORs byte by byte."""
    packed = _packed_ip(value[0])
    port = value[1] ^ _PORT_XOR
    if len(packed) == 4:
        return struct.pack("!BBHI", 0, 1, port, int.from_bytes(packed, "big") ^ COOKIE)
    mask = int.from_bytes(COOKIE.to_bytes(4, "big") + transaction_id, "big")
    return struct.pack("!BBH", 0, 2, port) + (int.from_bytes(packed, "big") ^ mask).to_bytes(
        16, "big"
    )


def unpack_xor_ipv4(raw: bytes) -> Address:
    """An 8-byte IPv4 XOR-*-ADDRESS value (family 1), cached: it does not depend on the
    transaction id, and a relay sees the same few peers over and over."""
    peer = _ipv4_by_xor.get(raw)
    if peer is None:
        ip = (int.from_bytes(raw[4:8], "big") ^ COOKIE).to_bytes(4, "big")
        peer = (f"{ip[0]}.{ip[1]}.{ip[2]}.{ip[3]}", ((raw[2] << 8) | raw[3]) ^ _PORT_XOR)
        remember(_ipv4_by_xor, raw, peer)
    return peer


def unpack_xor_address(raw: bytes, transaction_id: bytes) -> Address:
    if len(raw) == 8 and raw[1] == 1:
        return unpack_xor_ipv4(raw)
    return _aioice.unpack_xor_address(raw, transaction_id)


# -- messages --------------------------------------------------------------------------------


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
        """RFC 8489 §14.5: False when MESSAGE-INTEGRITY is missing or does not match `key`."""
        value = self.attributes.get("MESSAGE-INTEGRITY")
        if self.integrity_data is None or value is None:
            return False
        return hmac.compare_digest(value, _aioice.message_integrity(self.integrity_data, key))

    def __bytes__(self) -> bytes:
        if self.raw is not None:
            return self.raw
        attributes = {
            k: v
            for k, v in self.attributes.items()
            if k not in ("MESSAGE-INTEGRITY", "FINGERPRINT")
        }
        return encode(self.message_method, self.message_class, self.transaction_id, attributes)


class StunFormatError(ValueError):
    """A STUN header that frames the message right, around attributes that do not parse (or a
    FINGERPRINT that does not match). It keeps what a server needs to answer 400."""

    def __init__(self, reason: str, msg_type: int, transaction_id: bytes) -> None:
        super().__init__(reason)
        self.method = msg_type & 0x3EEF
        self.is_request = msg_type & 0x0110 == 0
        self.transaction_id = transaction_id


# Not frozen: one is built per message, and a frozen dataclass's __init__ costs about three
# times a plain one's (object.__setattr__ per field).
@dataclass(slots=True)
class Parsed:
    """A parsed message plus what a server checks that the attribute dict cannot hold."""

    message: Message
    unknown_required: tuple[int, ...]
    """Comprehension-required attribute types (below 0x8000) we do not know (RFC 8489 §7.3.1)."""
    peers: tuple[Address, ...]
    """Every XOR-PEER-ADDRESS, in order (a CreatePermission may carry several, RFC 8656 §9.1)."""


def looks_like_stun(data: bytes) -> bool:
    """RFC 8489 §6: two zero bits, a length that is a multiple of 4, the magic cookie."""
    return (
        len(data) >= HEADER_LENGTH
        and data[0] & 0xC0 == 0
        and data[3] & 0x03 == 0
        and data[4:8] == MAGIC
    )


def parse(data: bytes, *, known_methods_only: bool = False) -> Parsed:
    """Parse one whole STUN message in one pass.

    Raises ValueError for bytes that are not one STUN message, and its subclass StunFormatError
    for a message whose attributes are malformed: one that overruns the message or a bad
    XOR-PEER-ADDRESS at once, otherwise, after the walk, an unknown method (with
    `known_methods_only`) before the first attribute that did not unpack. Attributes after
    MESSAGE-INTEGRITY other than FINGERPRINT are ignored (RFC 8489 §14.5); a FINGERPRINT that
    does not match is malformed (§14.7).
    """
    if not looks_like_stun(data):
        raise ValueError("not a STUN message")
    msg_type, length, _cookie, tid = HEADER.unpack_from(data)
    if len(data) != HEADER_LENGTH + length:
        raise ValueError("STUN length does not match the datagram")
    walk = _Walk(data, msg_type, tid)
    walk.run()
    return walk.parsed(known_methods_only)


def parse_walked(
    data: bytes,
    msg_type: int,
    transaction_id: bytes,
    spans: Iterable[tuple[int, int, int]],
    *,
    known_methods_only: bool = False,
) -> Parsed:
    """`parse` of a message whose header and attribute framing the caller has checked already:
    `spans` lists its attributes as (type, offset, end of value), in order, none overrunning
    the message and none after MESSAGE-INTEGRITY but FINGERPRINT. For such a message the
    result, and the error raised, are `parse`'s; it spares the server a second walk."""
    walk = _Walk(data, msg_type, transaction_id)
    attribute = walk._attribute
    for attr_type, pos, stop in spans:
        attribute(attr_type, pos, stop)
    return walk.parsed(known_methods_only)


class _Walk:
    """The attribute walk of `parse`: one attribute per `_attribute` call, state in slots."""

    __slots__ = (
        "attributes",
        "data",
        "error",
        "integrity_data",
        "msg_type",
        "peers",
        "tid",
        "unknown",
    )

    def __init__(self, data: bytes, msg_type: int, tid: bytes) -> None:
        self.data = data
        self.msg_type = msg_type
        self.tid = tid
        self.attributes: dict[str, Any] = {}
        self.integrity_data: bytes | None = None
        self.unknown: list[int] = []
        self.peers: list[Address] = []
        self.error: str | None = None

    def run(self) -> None:
        data = self.data
        pos, end = HEADER_LENGTH, len(data)
        while pos + 4 <= end:
            attr_type, attr_len = ATTR_HEADER.unpack_from(data, pos)
            stop = pos + 4 + attr_len
            if stop > end:
                raise StunFormatError("attribute overruns the message", self.msg_type, self.tid)
            if self.integrity_data is None or attr_type == ATTR_FINGERPRINT:
                self._attribute(attr_type, pos, stop)
            pos = stop + (-attr_len % 4)

    def parsed(self, known_methods_only: bool) -> Parsed:
        """The message walked, or StunFormatError: an unknown method (with
        `known_methods_only`) before the first attribute that did not unpack."""
        msg_type, tid = self.msg_type, self.tid
        method = msg_type & 0x3EEF
        if known_methods_only and method not in KNOWN_METHODS:
            raise StunFormatError("unknown method", msg_type, tid)
        if self.error is not None:
            raise StunFormatError(self.error, msg_type, tid)
        message = Message(
            _METHOD_BY_NUMBER.get(method, method),
            _CLASS_BY_BITS[msg_type & 0x0110],
            tid,
            self.attributes,
            self.integrity_data,
            self.data,
        )
        return Parsed(message, tuple(self.unknown), tuple(self.peers))

    def _attribute(self, attr_type: int, pos: int, stop: int) -> None:
        data = self.data
        entry = ATTRIBUTES_BY_TYPE.get(attr_type)
        if entry is None:
            if attr_type < 0x8000:
                self.unknown.append(attr_type)
            return
        value = data[pos + 4 : stop]
        if attr_type == ATTR_XOR_PEER_ADDRESS:
            try:
                peer = unpack_xor_address(value, self.tid)
            except ValueError as exc:
                raise StunFormatError(
                    f"bad XOR-PEER-ADDRESS: {exc}", self.msg_type, self.tid
                ) from exc
            self.peers.append(peer)
            self.attributes["XOR-PEER-ADDRESS"] = peer
            return
        _, name, _, unpack_value = entry
        try:
            if unpack_value is _aioice.unpack_xor_address:
                self.attributes[name] = unpack_xor_address(value, self.tid)
            else:
                self.attributes[name] = unpack_value(value)
        except (ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
            if self.error is None:
                self.error = f"malformed attribute: {exc}"
            return
        if attr_type == ATTR_MESSAGE_INTEGRITY:
            self.integrity_data = data[:pos]
        elif (
            attr_type == ATTR_FINGERPRINT
            and self.error is None
            and self.attributes[name] != _aioice.message_fingerprint(data[:pos])
        ):
            self.error = "malformed attribute: STUN message fingerprint does not match"


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

    Attribute values are packed with aioice's table and ours, and the message is serialised once,
    instead of once per trailing attribute as `aioice.stun.Message` does. A sequence of
    (name, value) pairs may repeat a name (a dual allocation's two XOR-RELAYED-ADDRESS,
    RFC 8656 §7.2).
    """
    items = attributes.items() if isinstance(attributes, Mapping) else attributes
    packers = _PACKERS
    parts = [packers[name](value, transaction_id) for name, value in items]
    if software:
        parts.append(_packed_software(software, transaction_id))
    body = b"".join(parts)
    msg_type = method | klass
    if key is None:
        message = HEADER.pack(msg_type, len(body) + 8, COOKIE, transaction_id) + body
    else:
        length = len(body) + 24
        signed = HEADER.pack(msg_type, length, COOKIE, transaction_id) + body
        integrity = hmac.digest(key, signed, "sha1")
        message = b"".join(
            (HEADER.pack(msg_type, length + 8, COOKIE, transaction_id), body, _MI_HEADER, integrity)
        )
    return message + _FP_HEADER + _U32(binascii.crc32(message) ^ FINGERPRINT_XOR)


# -- what encode packs with ------------------------------------------------------------------
#
# Each attribute name maps to a function (value, transaction id) -> the whole attribute: header,
# value, padding. Values that repeat from answer to answer and do not depend on the transaction
# (SOFTWARE, REALM, ERROR-CODE, IPv4 addresses) are packed once and kept in bounded tables, keyed
# by exact type so that a value which would not pack (or packs otherwise) never meets a kept one.

Packer = Callable[[Any, bytes], bytes]
_packed_attributes: dict[tuple[int, Any], bytes] = {}
_xor_ipv4: dict[str, int] = {}
_XOR_IPV4_ATTRIBUTE = struct.Struct("!HHBBHI").pack


def _attribute_packer(attr_type: int, pack_value: Callable[[Any], bytes]) -> Packer:
    def pack(value: Any, transaction_id: bytes) -> bytes:
        packed = pack_value(value)
        n = len(packed)
        return ATTR_HEADER.pack(attr_type, n) + packed + bytes(-n % 4)

    return pack


def _is_string(value: Any) -> bool:
    return type(value) is str


def _is_code_and_reason(value: Any) -> bool:
    return (
        type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is str
    )


def _kept_packer(
    attr_type: int, pack_value: Callable[[Any], bytes], keepable: Callable[[Any], bool]
) -> Packer:
    """An attribute whose few values repeat (SOFTWARE, REALM: `_is_string`; ERROR-CODE,
    RFC 8489 §14.8: `_is_code_and_reason`), packed once per value that is `keepable`."""
    plain = _attribute_packer(attr_type, pack_value)

    def pack(value: Any, transaction_id: bytes) -> bytes:
        if not keepable(value):
            return plain(value, transaction_id)
        key = (attr_type, value)
        packed = _packed_attributes.get(key)
        if packed is None:
            packed = plain(value, transaction_id)
            remember(_packed_attributes, key, packed)
        return packed

    return pack


def _xor_address_packer(attr_type: int) -> Packer:
    """XOR-*-ADDRESS (RFC 8489 §14.2): IPv4 in one struct call, the XORed address kept."""

    def pack(value: Any, transaction_id: bytes) -> bytes:
        ip = value[0]
        xored = _xor_ipv4.get(ip) if type(ip) is str else None
        if xored is None:
            packed = pack_xor_address(value, transaction_id)
            if len(packed) == 8 and type(ip) is str:
                remember(_xor_ipv4, ip, int.from_bytes(packed[4:], "big"))
            return ATTR_HEADER.pack(attr_type, len(packed)) + packed
        return _XOR_IPV4_ATTRIBUTE(attr_type, 8, 0, 1, value[1] ^ _PORT_XOR, xored)

    return pack


def _lifetime_packer(attr_type: int) -> Packer:
    header = ATTR_HEADER.pack(attr_type, 4)

    def pack(value: Any, transaction_id: bytes) -> bytes:
        return header + _U32(value)

    return pack


def _packer(attr_type: int, name: str, pack_value: Callable[..., bytes]) -> Packer:
    if pack_value is _aioice.pack_xor_address:
        return _xor_address_packer(attr_type)
    if name in ("SOFTWARE", "REALM"):
        return _kept_packer(attr_type, _aioice.pack_string, _is_string)
    if name == "ERROR-CODE":
        return _kept_packer(attr_type, _aioice.pack_error_code, _is_code_and_reason)
    if name == "LIFETIME":
        return _lifetime_packer(attr_type)
    return _attribute_packer(attr_type, pack_value)


_PACKERS: dict[str, Packer] = {
    name: _packer(attr_type, name, pack_value)
    for name, (attr_type, _, pack_value, _) in ATTRIBUTES_BY_NAME.items()
}
_packed_software = _PACKERS["SOFTWARE"]


def with_fingerprint(msg_type: int, transaction_id: bytes, body: bytes | bytearray) -> bytes:
    """Header, `body` and a FINGERPRINT over both (RFC 8489 §14.7)."""
    header = HEADER.pack(msg_type, len(body) + 8, COOKIE, transaction_id)
    crc = binascii.crc32(header + body) ^ FINGERPRINT_XOR
    return header + bytes(body) + _FP_HEADER + _U32(crc)


def fingerprint_ok(data: bytes, at: int) -> bool:
    """The FINGERPRINT value at offset `at` matches the CRC of everything before it."""
    value = int.from_bytes(data[at + 4 : at + 8], "big")
    return binascii.crc32(data[:at]) ^ FINGERPRINT_XOR == value


def message_integrity(data: bytes, key: bytes) -> bytes:
    """HMAC-SHA1 over `data` (a message up to MESSAGE-INTEGRITY, its length covering it)."""
    return _aioice.message_integrity(data, key)


def address_family(host: str) -> int:
    """FAMILY_IPV4 or FAMILY_IPV6 for a literal IP address."""
    return FAMILY_IPV6 if ipaddress.ip_address(host).version == 6 else FAMILY_IPV4
