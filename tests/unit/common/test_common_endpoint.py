"""Endpoint syntax ``ip[/prefix][:<lo-hi>]`` and peer matching."""

from __future__ import annotations

import ipaddress

import pytest

from stunner_common.config import ClusterConfig, ConfigValidationError, Endpoint, parse_endpoint
from stunner_common.config.endpoint import canonical_endpoint, clear_endpoint_cache


@pytest.mark.parametrize(
    ("text", "network", "port_min", "port_max", "canonical"),
    [
        ("1.2.3.4", "1.2.3.4/32", 1, 65535, "1.2.3.4"),
        ("1.2.3.4/32", "1.2.3.4/32", 1, 65535, "1.2.3.4"),
        ("1.2.3.4/16", "1.2.0.0/16", 1, 65535, "1.2.0.0/16"),
        ("1.2.3.4:<1-2>", "1.2.3.4/32", 1, 2, "1.2.3.4:<1-2>"),
        ("1.2.3.4/16:<1-2>", "1.2.0.0/16", 1, 2, "1.2.0.0/16:<1-2>"),
        ("2.2.2.2/8:<3-4>", "2.0.0.0/8", 3, 4, "2.0.0.0/8:<3-4>"),
        ("1.2.3.4:<1-65535>", "1.2.3.4/32", 1, 65535, "1.2.3.4"),
        ("10.0.0.1:<0-0>", "10.0.0.1/32", 0, 0, "10.0.0.1:<0-0>"),
        ("0.0.0.0/0", "0.0.0.0/0", 1, 65535, "0.0.0.0/0"),
        ("2001:db8::1", "2001:db8::1/128", 1, 65535, "2001:db8::1"),
        ("2001:db8:3333:4444:5555:6666:7777:8888/32", "2001:db8::/32", 1, 65535, "2001:db8::/32"),
        ("2001:db8::1/32:<1-2>", "2001:db8::/32", 1, 2, "2001:db8::/32:<1-2>"),
        ("::1:<5000-5001>", "::1/128", 5000, 5001, "::1:<5000-5001>"),
        ("::/0", "::/0", 1, 65535, "::/0"),
        (" 1.2.3.4 ", "1.2.3.4/32", 1, 65535, "1.2.3.4"),
    ],
)
def test_endpoints_parse_to_a_masked_prefix_and_port_range(
    text: str, network: str, port_min: int, port_max: int, canonical: str
) -> None:
    endpoint = parse_endpoint(text)
    assert endpoint == Endpoint(ipaddress.ip_network(network), port_min, port_max)
    assert str(endpoint) == canonical
    assert parse_endpoint(str(endpoint)) == endpoint


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (":<1-65535>", "no address"),
        ("dummy", "not an IP address"),
        ("", "no address"),
        ("1.2.3.4/33", "not an IP address"),
        ("1.2.3.4:80", "not an IP address"),
        ("1.2.3.4:<1-2", "not an IP address"),
        ("1.2.3.4:<a-b>", "not an IP address"),
        ("1.2.3.4:<2-1>", "range 2-1 is empty"),
        ("1.2.3.4:<1-65536>", "port out of range"),
        ("1.2.3.4:<1-99999999999999999999>", "port out of range"),
        ("example.com", "not an IP address"),
        ("2001:db8::1/129", "not an IP address"),
    ],
)
def test_bad_endpoints_fail_with_a_clear_message(text: str, problem: str) -> None:
    with pytest.raises(ConfigValidationError, match=problem):
        parse_endpoint(text)


@pytest.mark.parametrize(
    ("endpoint", "ip", "contains"),
    [
        ("1.1.1.1", "1.1.1.1", True),
        ("1.1.1.1", "1.1.1.2", False),
        ("2.2.2.2/8:<3-4>", "2.128.3.3", True),
        ("2.2.2.2/8:<3-4>", "3.0.0.0", False),
        ("0.0.0.0/0", "203.0.113.7", True),
        ("0.0.0.0/0", "::1", False),
        ("0.0.0.0/0", "2001:db8::1", False),
        ("::/0", "2001:db8::1", True),
        ("::/0", "1.2.3.4", False),
        ("10.0.0.0/8", "::ffff:10.1.2.3", True),
        ("2001:db8::/32", "2001:db8:ffff::1", True),
        ("2001:db8::/32", "2001:db9::1", False),
        ("1.1.1.1", "not-an-ip", False),
    ],
)
def test_contains_checks_only_the_prefix(endpoint: str, ip: str, contains: bool) -> None:
    parsed = parse_endpoint(endpoint)
    assert parsed.contains(ip) is contains
    assert parsed.contains(ipaddress.ip_address(ip) if contains else ip) is contains


@pytest.mark.parametrize(
    ("endpoint", "ip", "port", "matches"),
    [
        ("1.1.1.1:<1-2>", "1.1.1.1", 1, True),
        ("1.1.1.1:<1-2>", "1.1.1.1", 2, True),
        ("1.1.1.1:<1-2>", "1.1.1.1", 3, False),
        ("1.1.1.1:<1-2>", "1.1.1.1", 0, True),
        ("1.1.1.1:<1-2>", "1.1.1.2", 1, False),
        ("2.2.2.2/8:<3-4>", "2.128.3.3", 3, True),
        ("2.2.2.2/8:<3-4>", "2.128.3.3", 5, False),
        ("1.2.3.5:<5678-5678>", "1.2.3.5", 5678, True),
        ("1.2.3.5:<5678-5678>", "1.2.3.5", 5677, False),
        ("1.2.3.5:<1-10000>", "1.2.3.5", 5678, True),
        ("1.2.3.5:<1-5677>", "1.2.3.5", 5678, False),
        ("1.2.3.5", "1.2.3.5", 65535, True),
        ("0.0.0.0/0", "::1", 5000, False),
        ("::1:<5000-5001>", "::1", 5001, True),
    ],
)
def test_matches_checks_prefix_and_port_with_port_zero_ignored(
    endpoint: str, ip: str, port: int, matches: bool
) -> None:
    assert parse_endpoint(endpoint).matches(ip, port) is matches


def test_a_cluster_of_ten_thousand_endpoints_validated_again_hits_the_cache_only() -> None:
    """Every render validates every endpoint again, in the same order: a cache smaller than
    that cycle would miss on each one."""
    endpoints = tuple(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(10_000))
    clear_endpoint_cache()
    ClusterConfig(name="ns/r", endpoints=endpoints)
    missed = canonical_endpoint.cache_info().misses
    ClusterConfig(name="ns/r", endpoints=endpoints)
    assert canonical_endpoint.cache_info().misses == missed == len(endpoints)
