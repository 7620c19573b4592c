"""Settings of the cluster-wide quota and of relay address discovery: env, defaults, refusals."""

from __future__ import annotations

import pytest

from stunnerd.quota import QuotaSettings
from stunnerd.settings import StunnerdSettings, load_settings


def settings(env: dict[str, str]) -> StunnerdSettings:
    return load_settings(env, config=None, watch=False, turn_uri=None, ident=None)


def test_without_a_redis_url_the_quota_counts_per_process() -> None:
    assert settings({}).quota is None


def test_quota_settings_come_from_the_environment() -> None:
    quota = settings(
        {
            "STUNNERD_QUOTA_REDIS_URL": "redis://u:p@redis:6379/0",
            "STUNNERD_QUOTA_REPLICAS": "4",
            "STUNNERD_QUOTA_LEASE_S": "30",
        }
    ).quota
    assert quota == QuotaSettings(
        "redis://u:p@redis:6379/0", replicas=4, timeout_s=0.5, retry_s=5.0, lease_s=30.0
    )


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"STUNNERD_QUOTA_REPLICAS": "0"}, "quota_replicas"),
        ({"STUNNERD_QUOTA_LEASE_S": "-1"}, "quota_lease_s"),
        ({"STUNNERD_NODE_ADDRESS": "node-1"}, "node address 'node-1' is not an IP address"),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        settings(env)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ""),
        ({"STUNNER_ADDR": "10.0.0.5"}, "10.0.0.5"),
        ({"STUNNER_ADDR": "$STUNNER_ADDR"}, ""),
        ({"STUNNER_ADDR": "10.0.0.5", "STUNNERD_NODE_ADDRESS": "203.0.113.5"}, "203.0.113.5"),
    ],
)
def test_the_node_address_defaults_to_the_pod_address(env: dict[str, str], expected: str) -> None:
    assert settings(env).node_address == expected
