"""Loopback, link-local, metadata and stunnerd's own addresses need a route that names them."""

from __future__ import annotations

import pytest

from stunner_common.config import StunnerConfig, parse_config
from stunnerd.protected import ProtectedRanges
from stunnerd.routing import DnsCache, RoutePeerPolicy, policies_for

OWN = ("10.0.0.5", "2001:db8::5", "127.0.0.1", "0.0.0.0")


def peers(
    endpoints: list[str], *, dns: DnsCache | None = None, kind: str = "STATIC"
) -> RoutePeerPolicy:
    cfg: StunnerConfig = parse_config(
        {
            "version": "v1",
            "auth": {"credentials": {"username": "u", "password": "p"}},
            "listeners": [{"name": "l", "protocol": "TURN-UDP", "routes": ["c"]}],
            "clusters": [{"name": "c", "type": kind, "endpoints": endpoints}],
        }
    )
    policy = policies_for(cfg.listeners[0], cfg, dns, ProtectedRanges.build(OWN)).peers
    assert isinstance(policy, RoutePeerPolicy)
    return policy


@pytest.mark.parametrize(
    ("endpoints", "peer", "admitted"),
    [
        # loopback: a prefix inside 127.0.0.0/8 names it; the whole Internet does not
        (["0.0.0.0/0"], "127.0.0.1", False),
        (["0.0.0.0/0"], "127.8.9.10", False),
        (["127.0.0.1/32"], "127.0.0.1", True),
        (["127.0.0.0/8"], "127.0.0.1", True),
        (["0.0.0.0/0", "127.0.0.1"], "127.0.0.1", True),
        (["::/0"], "::1", False),
        (["::1"], "::1", True),
        (["0.0.0.0/0"], "::ffff:127.0.0.1", False),  # IPv4-mapped is judged as IPv4
        # link-local and the metadata service inside it
        (["0.0.0.0/0"], "169.254.1.1", False),
        (["169.254.0.0/16"], "169.254.1.1", True),
        (["169.254.0.0/16"], "169.254.169.254", False),
        (["169.254.169.254"], "169.254.169.254", True),
        (["::/0"], "fe80::1", False),
        (["fe80::/10"], "fe80::1", True),
        (["::/0"], "fd00:ec2::254", False),
        # "this host"
        (["0.0.0.0/0"], "0.0.0.0", False),
        # stunnerd's own addresses: only an endpoint naming exactly that address
        (["10.0.0.0/8"], "10.0.0.5", False),
        (["10.0.0.0/8"], "10.0.0.6", True),
        (["10.0.0.5/32"], "10.0.0.5", True),
        (["2001:db8::/32"], "2001:db8::5", False),
        (["2001:db8::5"], "2001:db8::5", True),
        # ordinary peers are untouched
        (["0.0.0.0/0"], "192.0.2.7", True),
        (["0.0.0.0/0"], "10.1.2.3", True),
    ],
)
def test_protected_peers_need_an_endpoint_inside_their_range(
    endpoints: list[str], peer: str, admitted: bool
) -> None:
    policy = peers(endpoints)
    assert policy.admits_ip(peer) is admitted
    assert policy.admits(peer, 5000) is admitted
    assert (policy.cluster_of(peer, 5000) == "c") is admitted


def test_the_default_policy_protects_the_standard_ranges() -> None:
    cfg = parse_config(
        {
            "version": "v1",
            "auth": {"credentials": {"username": "u", "password": "p"}},
            "listeners": [{"name": "l", "protocol": "TURN-UDP", "routes": ["c"]}],
            "clusters": [{"name": "c", "endpoints": ["0.0.0.0/0"]}],
        }
    )
    policy = policies_for(cfg.listeners[0], cfg).peers
    assert not policy.admits_ip("127.0.0.1")
    assert not policy.admits_ip("169.254.169.254")
    assert policy.admits_ip("198.51.100.1")


def test_dns_names_admit_loopback_only_when_they_are_localhost_names() -> None:
    dns = DnsCache()
    dns.update("localhost", {"127.0.0.1"})
    dns.update("metadata.example.com", {"169.254.169.254"})
    dns.update("media.example.com", {"10.0.0.5", "10.0.0.9"})
    policy = peers(
        ["localhost", "metadata.example.com", "media.example.com"], dns=dns, kind="STRICT_DNS"
    )
    assert policy.admits("127.0.0.1", 9)
    assert not policy.admits("169.254.169.254", 80)
    assert not policy.admits("10.0.0.5", 9)  # resolves to stunnerd's own address
    assert policy.admits("10.0.0.9", 9)


def test_own_addresses_inside_a_standard_range_follow_that_range() -> None:
    ranges = ProtectedRanges.build(["127.0.0.1", "10.0.0.5", "10.0.0.5", "::ffff:10.0.0.7"])
    assert [str(net) for net, what in ranges.ranges if what == "stunnerd's own address"] == [
        "10.0.0.5/32",
        "10.0.0.7/32",
    ]
    assert ranges.describe("127.0.0.1") == "loopback"
    assert ranges.describe("169.254.169.254") == "cloud metadata"
    assert ranges.guard_of("192.0.2.1") is None
