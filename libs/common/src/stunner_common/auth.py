"""TURN credentials: the long-term key and TURN REST (ephemeral) usernames and passwords.

The auth service, turncat and the dataplane must agree bit for bit on these, so they live here as
pure functions with time passed in. Ephemeral usernames are ``<expiry>[:<userid>]`` (the parser
also accepts ``<userid>:<expiry>[:...]``, as upstream does); the password is
base64(HMAC-SHA1(secret, username)) (draft-uberti-behave-turn-rest-00). The key used for
MESSAGE-INTEGRITY is MD5(username:realm:password) (RFC 8489 §9.2.2), without SASLprep, like
upstream.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

__all__ = [
    "ephemeral_credentials",
    "ephemeral_expiry",
    "ephemeral_password",
    "ephemeral_user_id",
    "ephemeral_username",
    "ephemeral_username_valid",
    "long_term_key",
    "parse_ephemeral_username",
]

# Go's strconv.Atoi on 64-bit: optional sign, decimal digits, within int64.
CREDENTIAL_LIFETIME_KEY = "lifetime"
"""An ``auth.credentials`` key of ephemeral configs: the GatewayConfig's ``authLifetime`` (seconds),
the lifetime the auth service gives the credentials it hands out. stunnerd ignores it."""


def credential_lifetime(credentials: dict[str, str]) -> int | None:
    """The ``lifetime`` of ephemeral credentials in a config (None: unset or not a positive int)."""
    raw = credentials.get(CREDENTIAL_LIFETIME_KEY, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


_ATOI = re.compile(r"[+-]?[0-9]+")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _atoi(text: str) -> int | None:
    if len(text) > 25 or not _ATOI.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def ephemeral_username(expiry_unix: int, user_id: str | None = None) -> str:
    """``<expiry>`` or ``<expiry>:<user_id>``; `expiry_unix` is in UNIX seconds."""
    return f"{int(expiry_unix)}" if user_id is None else f"{int(expiry_unix)}:{user_id}"


def ephemeral_password(secret: str | bytes, username: str) -> str:
    """base64(HMAC-SHA1(key=secret, msg=username)): 28 characters with padding."""
    key = secret.encode() if isinstance(secret, str) else secret
    digest = hmac.new(key, username.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def ephemeral_credentials(
    secret: str | bytes, *, ttl_s: float, now: float, user_id: str | None = None
) -> tuple[str, str]:
    """A (username, password) pair valid until ``now + ttl_s`` (seconds, truncated)."""
    username = ephemeral_username(int(now + ttl_s), user_id)
    return username, ephemeral_password(secret, username)


def ephemeral_expiry(username: str) -> int | None:
    """The expiry timestamp in a TURN REST username: its first ``:``-separated integer part.

    A part is an integer when Go's ``strconv.Atoi`` would take it: optional sign, ASCII digits,
    within int64. A part outside int64 is not an expiry (it never means "valid forever"), so
    ``99999999999999999999999:bob`` has none and is refused.
    """
    for part in username.split(":"):
        value = _atoi(part)
        if value is not None:
            return value
    return None


def parse_ephemeral_username(username: str) -> tuple[int, str] | None:
    """(expiry, user id) of a TURN REST username, or None when it carries no non-zero expiry.

    The one rule every checker uses; the expiry is not compared with the clock here.
    """
    expiry = ephemeral_expiry(username)
    if expiry is None or expiry == 0:
        return None
    return expiry, ephemeral_user_id(username)


def ephemeral_username_valid(username: str, now: float) -> bool:
    """True if the username carries a non-zero expiry that is not before `now` (seconds)."""
    parsed = parse_ephemeral_username(username)
    return parsed is not None and parsed[0] >= int(now // 1)


def ephemeral_user_id(username: str) -> str:
    """The user id the TURN layer tracks: the part after ``<expiry>:`` when the username is
    exactly ``<expiry>:<id>``, else the whole username (upstream §3.4)."""
    parts = username.split(":")
    if len(parts) == 2 and _atoi(parts[0]) is not None:
        return parts[1]
    return username


def long_term_key(username: str, realm: str, password: str) -> bytes:
    """MD5("username:realm:password"), the 16-byte long-term credential key."""
    return hashlib.md5(f"{username}:{realm}:{password}".encode(), usedforsecurity=False).digest()
