"""The Redis key contract: every key under one prefix, the quota key and the node-address hash."""

from __future__ import annotations

import pytest

from stunner_common import redis_acl
from stunner_common.contracts import redis_keys
from stunner_common.contracts.redis_keys import (
    ALL_KEYS_PATTERN,
    KEY_PREFIX,
    QUOTA_KEY_PREFIX,
    QUOTA_KEYS_PATTERN,
    QuotaKey,
    decode_node_addresses,
    encode_node_addresses,
)

KEYS = {
    name: value
    for name, value in vars(redis_keys).items()
    if name.endswith(("_HASH", "_STREAM", "_COUNTER", "_PREFIX")) and name != "KEY_PREFIX"
}


def test_every_key_is_distinct_and_under_the_prefix_the_acl_grants() -> None:
    assert set(KEYS) >= {
        "CONFIGS_HASH",
        "REVS_HASH",
        "EVENTS_STREAM",
        "REV_COUNTER",
        "META_HASH",
        "NODE_ADDRESSES_HASH",
        "QUOTA_KEY_PREFIX",
    }
    assert len(set(KEYS.values())) == len(KEYS)
    assert all(key.startswith(KEY_PREFIX) for key in KEYS.values())
    assert f"~{ALL_KEYS_PATTERN} " in redis_acl.OPERATOR_RULES
    assert f"~{ALL_KEYS_PATTERN} " in redis_acl.CDS_RULES
    assert f"~{QUOTA_KEYS_PATTERN} " in redis_acl.DATAPLANE_RULES


@pytest.mark.parametrize(
    "key",
    [
        QuotaKey("default/gw", "stunner.l7mp.io", "alice"),
        QuotaKey("ns/gw", "realm", "1700000000:user:with:colons"),
        QuotaKey("ns/gw", "realm", ""),
    ],
)
def test_a_quota_key_round_trips(key: QuotaKey) -> None:
    encoded = key.encode()
    assert encoded.startswith(QUOTA_KEY_PREFIX)
    assert QuotaKey.decode(encoded) == key


@pytest.mark.parametrize("text", ["stunner:configs", "stunner:quota:ns/gw", "other:quota:a:b:c"])
def test_what_is_not_a_quota_key_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"quota key|<scope>"):
        QuotaKey.decode(text)


def test_the_node_addresses_round_trip_through_redis_bytes() -> None:
    addresses = {"worker-1": "198.51.100.7", "worker-2": "node-2.example.org"}
    fields = encode_node_addresses(addresses)
    as_redis_returns = {k.encode(): v.encode() for k, v in fields.items()}
    assert decode_node_addresses(as_redis_returns) == addresses
    assert decode_node_addresses(fields) == addresses
