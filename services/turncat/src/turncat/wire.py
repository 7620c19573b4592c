"""TURN client messages and framing, as pure functions over bytes.

This is the one module that touches aioice's STUN codec (`aioice.stun`), so the rest of turncat
deals in our own small types. It builds the requests a TURN client sends (RFC 8656 §7, §9, §11,
§12) and signs them with the long-term credential (RFC 8489 §9.2). ChannelData and stream framing
(RFC 8656 §12.5) are `stunner_common.framing`'s, shared with stunnerd.
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
