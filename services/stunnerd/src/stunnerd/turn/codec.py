"""The server's side of the STUN/TURN wire format, over `stunner_common.stun`.

The codec itself (header, attribute tables, MESSAGE-INTEGRITY, FINGERPRINT, the RFC 6062 methods)
is `stunner_common.stun`'s, shared with turncat; this module adds what only a TURN server does:
it sorts decode failures into "drop" and "answer 400", builds error responses, reads plain Send
indications by hand and builds Data indications, the two per-packet paths of clients that relay
without channels. ChannelData and stream framing (RFC 8656 §12.5) are `stunner_common.framing`'s.
Both are re-exported here so that the engine reaches the wire through this one module.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Any

from stunner_common import stun
from stunner_common.framing import channel_data as channel_data
from stunner_common.framing import parse_channel_data as parse_channel_data
from stunner_common.framing import stream_frame_length as stream_frame_length
from stunner_common.stun import ATTRIBUTES_BY_NAME as ATTRIBUTES_BY_NAME
from stunner_common.stun import COOKIE as COOKIE
from stunner_common.stun import EXTRA_ATTRIBUTES as EXTRA_ATTRIBUTES
from stunner_common.stun import FAMILY_IPV4 as FAMILY_IPV4
from stunner_common.stun import FAMILY_IPV6 as FAMILY_IPV6
from stunner_common.stun import HEADER_LENGTH as HEADER_LENGTH
from stunner_common.stun import KNOWN_ATTRIBUTE_TYPES as KNOWN_ATTRIBUTE_TYPES
from stunner_common.stun import LEGACY_ATTRIBUTES as LEGACY_ATTRIBUTES
from stunner_common.stun import TRANSPORT_TCP as TRANSPORT_TCP
from stunner_common.stun import TRANSPORT_UDP as TRANSPORT_UDP
from stunner_common.stun import Class as Class
from stunner_common.stun import Message as Message
from stunner_common.stun import Method as Method
from stunner_common.stun import encode as encode
from stunner_common.stun import looks_like_stun as looks_like_stun
from stunner_common.stun import pack_xor_address as pack_xor_address

CHANNEL_MIN = stun.CHANNEL_MIN
# RFC 8656 §12 narrowed channels to 0x4000-0x4FFF, but RFC 5766 clients (coturn's uclient among
# them) still pick from 0x4000-0x7FFF, and pion accepts that range: so do we.
CHANNEL_MAX = 0x7FFF

TcpMethod = Method
"""The RFC 6062 methods (CONNECT, CONNECTION_BIND, CONNECTION_ATTEMPT) are members of `Method`."""

Decoded = stun.Parsed
"""A decoded message, the comprehension-required attribute types we do not know and every
XOR-PEER-ADDRESS before MESSAGE-INTEGRITY."""


class StunDecodeError(ValueError):
    """The bytes are not a STUN message we can answer (the caller drops them)."""


class StunBadRequestError(ValueError):
    """A well-framed STUN request whose content is malformed: worth a 400 answer."""

    def __init__(self, method: int, transaction_id: bytes, reason: str) -> None:
        super().__init__(reason)
        self.method = method
        self.transaction_id = transaction_id


def decode(data: bytes) -> Decoded:
    """Parse one STUN message. Raises StunDecodeError (drop) or StunBadRequestError (answer 400)."""
    return _sorted(stun.parse, data)


def decode_scanned(
    data: bytes, msg_type: int, transaction_id: bytes, spans: list[tuple[int, int, int]]
) -> Decoded:
    """`decode` of a request whose header and attributes `precheck` has walked (`spans`, the
    attributes it found): the same result and errors, without walking the message again."""
    return _sorted(stun.parse_walked, data, msg_type, transaction_id, spans)


def _sorted(parse: Callable[..., Decoded], *args: Any) -> Decoded:
    """`parse(*args)` for known methods only, its failures sorted into drop and answer 400."""
    try:
        return parse(*args, known_methods_only=True)
    except stun.StunFormatError as exc:
        if exc.is_request:
            raise StunBadRequestError(exc.method, exc.transaction_id, str(exc)) from exc
        raise StunDecodeError(str(exc)) from exc
    except ValueError as exc:
        raise StunDecodeError(str(exc)) from exc


_SEND_INDICATION_TYPE = 0x0016
_DATA_INDICATION_TYPE = 0x0017
_ATTR_HEADER = stun.ATTR_HEADER
_FP_HEADER = b"\x80\x28\x00\x04"
_MAGIC = stun.MAGIC
_FINGERPRINT_XOR = stun.FINGERPRINT_XOR
_crc32 = binascii.crc32
_unpack_xor_ipv4 = stun.unpack_xor_ipv4
_xor_peer_attr: dict[tuple[str, int], bytes] = {}


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
        or (data[2] << 8 | data[3]) != end - HEADER_LENGTH
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
        if attr_type == 0x0012:  # XOR-PEER-ADDRESS
            if peer is not None or attr_len != 8 or data[pos + 5] != 1:
                return None
            peer = _unpack_xor_ipv4(data[pos + 4 : stop])
        elif attr_type == 0x0013:  # DATA
            payload = data[pos + 4 : stop]
        elif attr_type == 0x8028:  # FINGERPRINT, last (RFC 8489 §14.7)
            if (
                attr_len != 4
                or stop != end
                or _crc32(data[:pos]) ^ _FINGERPRINT_XOR
                != int.from_bytes(data[pos + 4 : stop], "big")
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
        attr = _ATTR_HEADER.pack(stun.ATTR_XOR_PEER_ADDRESS, len(packed)) + packed
        if len(packed) == 8:  # IPv4 does not depend on the transaction id: reuse it
            stun.remember(_xor_peer_attr, peer, attr)
    n = len(payload)
    pad = -n % 4
    header = stun.HEADER.pack(
        _DATA_INDICATION_TYPE, len(attr) + 4 + n + pad + 8, COOKIE, transaction_id
    )
    message = b"".join((header, attr, _ATTR_HEADER.pack(stun.ATTR_DATA, n), payload, bytes(pad)))
    return message + _FP_HEADER + (_crc32(message) ^ _FINGERPRINT_XOR).to_bytes(4, "big")


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
    return message.check_message_integrity(key)
