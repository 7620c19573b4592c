"""CDS addresses and URLs as the one client builds them."""

from __future__ import annotations

import pytest

from stunner_common.io.cds import CdsAddressError, CdsClient, cds_base_url, watch_url


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.7", "http://10.0.0.7:13478"),
        ("10.0.0.7:8080", "http://10.0.0.7:8080"),
        ("[::1]:9", "http://[::1]:9"),
        ("http://cds.example:8080/some/path?q=1", "http://cds.example:8080"),
        ("https://cds.example", "https://cds.example"),
        ("ws://cds:1", "http://cds:1"),
        ("wss://cds", "https://cds"),
    ],
)
def test_address_forms(address: str, expected: str) -> None:
    assert cds_base_url(address) == expected


@pytest.mark.parametrize("address", ["ftp://cds", "http://", "cds:99999", "cds:port"])
def test_bad_addresses_are_refused_with_the_address_named(address: str) -> None:
    with pytest.raises(CdsAddressError, match="invalid CDS address"):
        cds_base_url(address)


def test_urls_of_a_config_a_namespace_and_a_watch() -> None:
    client = CdsClient("https://cds:1")
    assert client.url() == "https://cds:1/api/v1/configs"
    assert client.url("a b", "c/d") == "https://cds:1/api/v1/configs/a%20b/c%2Fd"
    assert (
        client.url("ns", None, {"watch": "true"}, websocket=True)
        == "wss://cds:1/api/v1/configs/ns?watch=true"
    )
    assert watch_url("http://h:2", "ns", "gw") == "ws://h:2/api/v1/configs/ns/gw?watch=true"
