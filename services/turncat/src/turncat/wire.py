"""The client's side of the STUN/TURN wire format, over `stunner_common.stun`.

The codec itself (header, attribute tables, MESSAGE-INTEGRITY, FINGERPRINT, the RFC 6062 methods)
is `stunner_common.stun`'s, shared with stunnerd; this module adds what only a TURN client does:
sign requests with long-term credentials (RFC 8489 §9.2), drop what does not parse, and read the
ERROR-CODE of an answer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

from stunner_common.auth import long_term_key
from stunner_common.stun import Class, Message, Method, encode, parse


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
    return parse(wire).message


def parse_stun(data: bytes) -> Message | None:
    """Decode a STUN message, or None for anything malformed (the caller drops it).

    Attributes after MESSAGE-INTEGRITY other than FINGERPRINT are ignored (RFC 8489 §14.5), and
    a FINGERPRINT that does not match rejects the message.
    """
    try:
        return parse(data).message
    except ValueError:
        return None


def integrity_ok(msg: Message, key: bytes) -> bool:
    """False only when the message carries MESSAGE-INTEGRITY and it does not match `key`."""
    if "MESSAGE-INTEGRITY" not in msg.attributes:
        return True
    return msg.check_message_integrity(key)


class _Answer(Protocol):
    @property
    def attributes(self) -> dict[str, Any]: ...


def error_of(msg: _Answer) -> tuple[int, str]:
    """The ERROR-CODE of an error response as (code, reason)."""
    value = msg.attributes.get("ERROR-CODE")
    if value is None:
        return 0, "error response without ERROR-CODE"
    return int(value[0]), str(value[1])
