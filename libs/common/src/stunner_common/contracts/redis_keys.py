"""The Redis key layout: every key and prefix the operator, the CDS and stunnerd use.

One definition so that writer, reader and any other tool agree on the names: a hash of canonical
configs with the revision of each, a change stream appended in the same atomic step as each hash
write, the global revision counter that numbers those changes and the store's epoch (the
operator's `stunner_common.io.store.publisher` writes them, the CDS's `reader` reads them); the
Node addresses for relay address discovery (operator → CDS); and stunnerd's cluster-wide user
quota leases. The ACL key patterns of the Redis users (`stunner_common.redis_acl`) are derived
from these prefixes. docs/architecture.md draws the layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

KEY_PREFIX: Final = "stunner:"
"""Every key of stunner's starts with this."""

CONFIGS_HASH: Final = KEY_PREFIX + "configs"
"""Hash: field ``ns/name`` -> canonical JSON of that Gateway's stunnerd config."""

REVS_HASH: Final = KEY_PREFIX + "revs"
"""Hash: field ``ns/name`` -> revision of its last change (upsert or delete)."""

EVENTS_STREAM: Final = KEY_PREFIX + "events"
"""Stream: one entry per change with fields ``op`` (upsert|delete), ``id``, ``rev``, ``config``."""

REV_COUNTER: Final = KEY_PREFIX + "rev"
"""String counter: the global revision, incremented once by every change."""

META_HASH: Final = KEY_PREFIX + "meta"
"""Hash: field `EPOCH_FIELD` -> the id of the store's current history."""

EPOCH_FIELD: Final = "epoch"

NODE_ADDRESSES_HASH: Final = KEY_PREFIX + "nodes"
"""Hash: Node name -> the address its stunnerd pods relay from when a listener asks for relay
address discovery (the Node's ExternalIP). The operator writes it; the CDS reads it to fill in
the node-address placeholder for a client that names its node."""

QUOTA_KEY_PREFIX: Final = KEY_PREFIX + "quota:"
"""Sorted sets ``stunner:quota:<gateway id>:<realm>:<user id>``: lease id -> expiry (ms)."""

ALL_KEYS_PATTERN: Final = KEY_PREFIX + "*"
"""The ACL key pattern of the operator's and the CDS's Redis users."""

QUOTA_KEYS_PATTERN: Final = QUOTA_KEY_PREFIX + "*"
"""The ACL key pattern of the stunnerd pods' Redis user: the quota leases only."""


@dataclass(frozen=True, slots=True)
class QuotaKey:
    """The sorted set of one user's quota leases. `scope` (the gateway id) and `realm` hold no
    ``:``; the user id may (TURN REST usernames do)."""

    scope: str
    realm: str
    user_id: str

    def encode(self) -> str:
        return f"{QUOTA_KEY_PREFIX}{self.scope}:{self.realm}:{self.user_id}"

    @classmethod
    def decode(cls, key: str) -> QuotaKey:
        if not key.startswith(QUOTA_KEY_PREFIX):
            raise ValueError(f"{key!r} is not a quota key ({QUOTA_KEY_PREFIX}...)")
        parts = key[len(QUOTA_KEY_PREFIX) :].split(":", 2)
        if len(parts) != 3:
            raise ValueError(f"{key!r} is not {QUOTA_KEY_PREFIX}<scope>:<realm>:<user id>")
        return cls(*parts)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def encode_node_addresses(addresses: Mapping[str, str]) -> dict[str, str]:
    """The fields of `NODE_ADDRESSES_HASH`: Node name -> address (an IP or a DNS name)."""
    return dict(addresses)


def decode_node_addresses(raw: Mapping[Any, Any]) -> dict[str, str]:
    """`NODE_ADDRESSES_HASH` as Redis returns it (HGETALL, bytes or text) -> Node -> address."""
    return {_text(k): _text(v) for k, v in raw.items()}
