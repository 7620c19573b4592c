"""Auth, nonce and peer-admission policies, and the config → policy conversion."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from stunner_common.auth import parse_ephemeral_username
from stunner_common.config import StunnerConfig, parse_config
from stunnerd.routing import DnsCache, policies_for
from stunnerd.turn.policies import (
    EphemeralAuthenticator,
    NonceMint,
    StaticAuthenticator,
    UserQuota,
)

NOW = 1_700_000_000


@pytest.mark.parametrize(
    ("username", "expected"),
    [
        (f"{NOW}", (NOW, f"{NOW}")),
        (f"{NOW}:alice", (NOW, "alice")),
        (f"alice:{NOW}", (NOW, f"alice:{NOW}")),
        (f"alice:{NOW}:x", (NOW, f"alice:{NOW}:x")),
        ("alice", None),
        ("0:alice", None),
        ("", None),
        ("1e9:alice", None),
    ],
)
def test_turn_rest_usernames_give_expiry_and_user_id(
    username: str, expected: tuple[int, str] | None
) -> None:
    assert parse_ephemeral_username(username) == expected


def test_ephemeral_password_is_base64_hmac_sha1_of_the_username() -> None:
    auth = EphemeralAuthenticator("r", "secret")
    mac = hmac.new(b"secret", b"123:u", hashlib.sha1).digest()
    assert auth.password("123:u") == base64.b64encode(mac).decode()


def test_an_expiry_beyond_int64_is_no_expiry_and_the_username_is_refused() -> None:
    auth = EphemeralAuthenticator("r", "s")
    assert auth.lookup("99999999999999999999999:bob", NOW) is None
    assert auth.lookup(f"99999999999999999999999:{NOW}", NOW) is not None  # next part counts


def test_ephemeral_username_is_valid_up_to_and_including_its_expiry_second() -> None:
    auth = EphemeralAuthenticator("r", "s")
    assert auth.lookup(f"{NOW}:u", NOW + 0.9) is not None
    assert auth.lookup(f"{NOW}:u", NOW + 1) is None


def test_static_authenticator_accepts_only_its_username() -> None:
    auth = StaticAuthenticator("realm", "user", "pass")
    cred = auth.lookup("user", NOW)
    assert cred is not None
    assert cred.key == hashlib.md5(b"user:realm:pass").digest()
    assert auth.lookup("User", NOW) is None


def test_nonces_expire_and_cannot_be_forged_or_come_from_the_future() -> None:
    mint = NonceMint(b"s" * 32, lifetime_s=10)
    nonce = mint.issue(100.0)
    assert mint.valid(nonce, 105.0)
    assert not mint.valid(nonce, 110.0)
    assert not mint.valid(nonce, 50.0)
    assert not NonceMint(b"t" * 32).valid(nonce, 100.0)
    assert not mint.valid(b"x" * 40, 100.0)
    assert not mint.valid(b"x" * 24, 100.0)
    assert len(nonce) == 24
    assert not mint.valid(b"", 100.0)


def test_quota_zero_is_unlimited() -> None:
    assert UserQuota(0).allows("u", {"u": 1000})
    assert not UserQuota(2).allows("u", {"u": 2})


def config(clusters: list[dict[str, object]], routes: list[str]) -> StunnerConfig:
    return parse_config(
        {
            "version": "v1",
            "auth": {"credentials": {"username": "u", "password": "p"}},
            "listeners": [{"name": "l", "protocol": "TURN-UDP", "routes": routes}],
            "clusters": clusters,
        }
    )


def test_peer_admission_follows_routes_clusters_and_port_ranges() -> None:
    cfg = config(
        [
            {"name": "media", "endpoints": ["10.0.0.0/24:<10000-20000>", "10.1.0.1"]},
            {"name": "v6", "endpoints": ["2001:db8::/32"]},
            {"name": "unrouted", "endpoints": ["192.168.0.0/16"]},
        ],
        ["media", "v6", "missing"],
    )
    peers = policies_for(cfg.listeners[0], cfg).peers
    assert peers.admits("10.0.0.7", 15000)
    assert not peers.admits("10.0.0.7", 9999)
    assert peers.admits_ip("10.0.0.7")
    assert peers.admits("10.1.0.1", 1)
    assert peers.admits("2001:db8::5", 1)
    assert not peers.admits_ip("192.168.1.1")
    assert not peers.admits_ip("10.0.1.1")


def test_tcp_clusters_admit_permissions_but_not_udp_data() -> None:
    cfg = config([{"name": "tcp", "protocol": "TCP", "endpoints": ["1.1.1.1"]}], ["tcp"])
    peers = policies_for(cfg.listeners[0], cfg).peers
    assert peers.admits_ip("1.1.1.1")
    assert not peers.admits("1.1.1.1", 5000)


def test_strict_dns_clusters_admit_what_the_names_resolve_to() -> None:
    cfg = config(
        [{"name": "dns", "type": "STRICT_DNS", "endpoints": ["media.example.com"]}], ["dns"]
    )
    dns = DnsCache()
    peers = policies_for(cfg.listeners[0], cfg, dns).peers
    assert not peers.admits("10.9.9.9", 1)
    assert dns.update("media.example.com", {"10.9.9.9"})
    assert peers.admits("10.9.9.9", 1)
    assert not dns.update("media.example.com", {"10.9.9.9"})


@pytest.mark.parametrize(
    ("auth", "kind"),
    [
        ({"type": "static", "credentials": {"username": "u", "password": "p"}}, "Static"),
        ({"type": "ephemeral", "credentials": {"secret": "s"}}, "Ephemeral"),
        ({"type": "none"}, "No"),
    ],
)
def test_auth_type_selects_the_authenticator(auth: dict[str, object], kind: str) -> None:
    cfg = parse_config({"version": "v1", "auth": auth, "listeners": [{"name": "l"}]})
    authenticator = policies_for(cfg.listeners[0], cfg).authenticator
    assert type(authenticator).__name__ == f"{kind}Authenticator"


def test_traffic_is_attributed_to_the_first_routed_udp_cluster_that_admits_the_peer() -> None:
    cfg = config(
        [
            {"name": "tcp", "protocol": "TCP", "endpoints": ["10.0.0.0/8"]},
            {"name": "media", "endpoints": ["10.0.0.0/24:<10000-20000>"]},
            {"name": "wide", "endpoints": ["10.0.0.0/8"]},
            {"name": "dns", "type": "STRICT_DNS", "endpoints": ["media.example.com"]},
        ],
        ["tcp", "media", "wide", "dns"],
    )
    dns = DnsCache()
    peers = policies_for(cfg.listeners[0], cfg, dns).peers
    assert peers.cluster_of("10.0.0.7", 15000) == "media"
    assert peers.cluster_of("10.0.0.7", 9999) == "wide"
    assert peers.cluster_of("192.168.1.1", 15000) is None
    assert dns.update("media.example.com", {"192.168.1.1"})
    assert peers.cluster_of("192.168.1.1", 15000) == "dns"  # a DNS change clears the memo
