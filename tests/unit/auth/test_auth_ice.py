"""What the auth service hands out for a set of configs: URIs, credentials, filters."""

from __future__ import annotations

from typing import Any

import pytest

from stunner_auth.ice import IceQuery, NoMatchError, ice_config, turn_rest_answer
from stunner_common.auth import ephemeral_password
from stunner_common.config import StunnerConfig, parse_config, self_signed_pair

NOW = 1_700_000_000.0
CERT, KEY = self_signed_pair("127.0.0.1")


def gateway(
    config_id: str, listeners: list[dict[str, Any]], auth: dict[str, Any] | None = None
) -> StunnerConfig:
    return parse_config(
        {
            "version": "v1",
            "admin": {"name": config_id},
            "auth": auth
            or {"type": "static", "credentials": {"username": "user-1", "password": "pass-1"}},
            "listeners": [{**item, "name": f"{config_id}/{item['name']}"} for item in listeners],
        },
        expand_env=False,
    )


CONFIGS = {
    "stunner/udp-gateway": gateway(
        "stunner/udp-gateway",
        [
            {
                "name": "udp-listener",
                "protocol": "TURN-UDP",
                "address": "$STUNNER_ADDR",
                "public_address": "1.2.3.4",
                "public_port": 3478,
            }
        ],
    ),
    "stunner/tcp-gateway": gateway(
        "stunner/tcp-gateway",
        [
            {"name": "tcp-listener", "protocol": "TURN-TCP", "address": "127.0.0.1", "port": 3479},
            {"name": "hidden", "protocol": "TURN-UDP", "address": "0.0.0.0", "port": 3480},
        ],
    ),
    "media/tls-gateway": gateway(
        "media/tls-gateway",
        [
            {
                "name": "tls",
                "protocol": "TURN-TLS",
                "public_address": "5.6.7.8",
                "public_port": 443,
                "cert": CERT,
                "key": KEY,
            }
        ],
        {"type": "ephemeral", "credentials": {"secret": "s3cret"}},
    ),
}


@pytest.mark.parametrize(
    ("query", "uris"),
    [
        (
            IceQuery(namespace="stunner"),
            ["turn:127.0.0.1:3479?transport=tcp", "turn:1.2.3.4:3478?transport=udp"],
        ),
        (IceQuery(gateway="udp-gateway"), ["turn:1.2.3.4:3478?transport=udp"]),
        (
            IceQuery(namespace="stunner", listener="tcp-listener"),
            ["turn:127.0.0.1:3479?transport=tcp"],
        ),
        (
            IceQuery(listener="stunner/tcp-gateway/tcp-listener"),
            ["turn:127.0.0.1:3479?transport=tcp"],
        ),
        (IceQuery(namespace="media"), ["turns:5.6.7.8:443?transport=tcp"]),
    ],
)
def test_filters_pick_the_listeners_clients_can_reach(query: IceQuery, uris: list[str]) -> None:
    answer = turn_rest_answer(CONFIGS, query, NOW)
    assert answer["uris"] == uris


def test_static_auth_hands_out_the_static_pair_and_the_asked_ttl() -> None:
    answer = turn_rest_answer(CONFIGS, IceQuery(gateway="udp-gateway", ttl_s=600), NOW)
    assert answer == {
        "username": "user-1",
        "password": "pass-1",
        "ttl": 600,
        "uris": ["turn:1.2.3.4:3478?transport=udp"],
    }


def test_ephemeral_auth_hands_out_turn_rest_credentials_valid_for_the_ttl() -> None:
    answer = turn_rest_answer(CONFIGS, IceQuery(namespace="media", username="alice", ttl_s=60), NOW)
    assert answer["username"] == f"{int(NOW) + 60}:alice"
    assert answer["password"] == ephemeral_password("s3cret", f"{int(NOW) + 60}:alice")
    anonymous = turn_rest_answer(CONFIGS, IceQuery(namespace="media", ttl_s=60), NOW)
    assert anonymous["username"] == f"{int(NOW) + 60}"


def test_ice_config_has_one_server_per_auth_setting_and_the_asked_policy() -> None:
    answer = ice_config(CONFIGS, IceQuery(ice_transport_policy="relay", ttl_s=60), NOW)
    assert answer["iceTransportPolicy"] == "relay"
    servers = answer["iceServers"]
    assert isinstance(servers, list)
    assert servers == [
        {
            "urls": ["turns:5.6.7.8:443?transport=tcp"],
            "username": f"{int(NOW) + 60}",
            "credential": ephemeral_password("s3cret", f"{int(NOW) + 60}"),
        },
        {
            "urls": ["turn:127.0.0.1:3479?transport=tcp", "turn:1.2.3.4:3478?transport=udp"],
            "username": "user-1",
            "credential": "pass-1",
        },
    ]


@pytest.mark.parametrize(
    "query",
    [
        IceQuery(namespace="nowhere"),
        IceQuery(gateway="tcp-gateway", listener="hidden"),
        IceQuery(listener="nope"),
    ],
)
def test_a_query_nothing_matches_says_which_filters_failed(query: IceQuery) -> None:
    with pytest.raises(NoMatchError, match="no Gateway"):
        ice_config(CONFIGS, query, NOW)
    with pytest.raises(NoMatchError):
        turn_rest_answer({}, IceQuery(), NOW)


LIFETIME_CONFIGS = {
    "media/short": gateway(
        "media/short",
        [{"name": "udp", "protocol": "TURN-UDP", "public_address": "9.9.9.9", "port": 3478}],
        {"type": "ephemeral", "credentials": {"secret": "s3cret", "lifetime": "600"}},
    )
}


@pytest.mark.parametrize(
    ("query", "expected_ttl"),
    [
        (IceQuery(), 600),  # no ttl asked: the GatewayConfig's authLifetime
        (IceQuery(ttl_s=60, ttl_given=True), 60),  # a shorter ttl wins
        (IceQuery(ttl_s=7200, ttl_given=True), 600),  # a longer one is capped
    ],
)
def test_auth_lifetime_sets_the_lifetime_of_ephemeral_credentials(
    query: IceQuery, expected_ttl: int
) -> None:
    answer = turn_rest_answer(LIFETIME_CONFIGS, query, NOW)
    assert answer["ttl"] == expected_ttl
    username = str(answer["username"])
    assert int(username.split(":")[0]) == int(NOW) + expected_ttl
    assert answer["password"] == ephemeral_password("s3cret", username)
    ice = ice_config(LIFETIME_CONFIGS, query, NOW)
    servers: Any = ice["iceServers"]
    assert int(servers[0]["username"].split(":")[0]) == int(NOW) + expected_ttl


@pytest.mark.parametrize("raw", ["0", "-5", "soon", ""])
def test_a_lifetime_that_is_not_a_positive_number_is_ignored(raw: str) -> None:
    configs = {
        "media/x": gateway(
            "media/x",
            [{"name": "udp", "protocol": "TURN-UDP", "public_address": "9.9.9.9", "port": 3478}],
            {"type": "ephemeral", "credentials": {"secret": "s3cret", "lifetime": raw}},
        )
    }
    assert turn_rest_answer(configs, IceQuery(ttl_s=123), NOW)["ttl"] == 123


def test_a_listener_with_only_the_pod_address_placeholder_gets_no_uri() -> None:
    # A Gateway behind a Service with no load balancer address and nodes with no external IP
    # (a bare-metal or one-node cluster): the operator renders no public address, and the
    # listener's address is what only stunnerd expands. Clients get a clear 404 reason, never
    # "turn:$STUNNER_ADDR:3478".
    pending = {
        "stunner/pending": gateway(
            "stunner/pending",
            [{"name": "udp", "protocol": "TURN-UDP", "address": "$STUNNER_ADDR", "port": 3478}],
        )
    }
    with pytest.raises(NoMatchError, match="gateway=pending has a listener with a client-reach"):
        ice_config(pending, IceQuery(gateway="pending"), NOW)
    both = {**CONFIGS, **pending}
    assert turn_rest_answer(both, IceQuery(namespace="stunner"), NOW)["uris"] == [
        "turn:127.0.0.1:3479?transport=tcp",
        "turn:1.2.3.4:3478?transport=udp",
    ]
