"""What `stunnerd.routing` derives from a config for the edge (protected ranges with stunnerd's
own addresses, the quota's terms, the STRICT_DNS names kept), and the journal that turns a live
allocation into the handoff document's record
(`stunnerd.handoff.transport.records.RecordJournal`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pytest

from stunner_common.config import StunnerConfig, parse_config
from stunnerd.handoff.transport.records import (
    RecordJournal,
    record_bytes,
    record_json,
    record_of,
)
from stunnerd.handoff.transport.state import (
    Address,
    AllocationRecord,
    ChannelRecord,
    allocation_doc,
    read_allocation,
)
from stunnerd.net.ports import AllocationJournal
from stunnerd.routing import DnsCache, dns_names, protected_for, quota_terms
from stunnerd.turn.allocation import Allocation, Channel


def config() -> StunnerConfig:
    return parse_config(
        {
            "version": "v1",
            "admin": {"name": "ns/gw", "user_quota": 3},
            "auth": {
                "type": "static",
                "realm": "example.org",
                "credentials": {"username": "u", "password": "p"},
            },
            "listeners": [
                {"name": "udp", "protocol": "TURN-UDP", "address": "192.0.2.10", "port": 3478}
            ],
            "clusters": [
                {"name": "dns", "type": "STRICT_DNS", "endpoints": ["Media.Example.ORG."]}
            ],
        }
    )


def test_stunnerds_own_addresses_are_protected_each_on_its_own() -> None:
    protected = protected_for(
        config(),
        host_addresses={"198.51.100.7"},
        bind_host="0.0.0.0",
        node_address="203.0.113.5",
        relay_addresses=("2001:db8::9",),
    )
    for own in ("198.51.100.7", "192.0.2.10", "203.0.113.5", "2001:db8::9"):
        assert protected.describe(own) == "stunnerd's own address"
    assert protected.describe("198.51.100.8") is None
    assert protected.describe("127.0.0.1") == "loopback"


def test_without_a_node_address_only_the_others_are_protected() -> None:
    protected = protected_for(config(), host_addresses=(), bind_host="192.0.2.11")
    assert protected.describe("192.0.2.11") == "stunnerd's own address"
    assert protected.describe("203.0.113.5") is None


def test_the_quota_counts_under_the_gateway_and_the_realm() -> None:
    terms = quota_terms(config())
    assert (terms.scope, terms.realm, terms.limit) == ("ns/gw", "example.org", 3)


def test_names_a_config_no_longer_mentions_are_forgotten() -> None:
    dns = DnsCache()
    dns.update("media.example.org", {"192.0.2.1"})
    dns.update("gone.example.org", {"192.0.2.2"})
    before = dns.version
    dns.keep_only(dns_names(config()))
    assert dns.names() == {"media.example.org"}
    assert dns.version == before + 1


class Sink:
    def __init__(self) -> None:
        self.records: list[tuple[str, AllocationRecord, int]] = []
        self.gone: list[tuple[str, Address]] = []

    def changed(
        self, listener: str, client: Address, record_json: bytes, fds: Sequence[int]
    ) -> None:
        record = read_allocation(json.loads(record_json), listener)
        assert record.client == client
        self.records.append((listener, record, len(fds)))

    def deleted(self, listener: str, client: Address) -> None:
        self.gone.append((listener, client))


def test_the_record_journal_writes_lifetimes_as_seconds_left() -> None:
    sink = Sink()
    journal: AllocationJournal = RecordJournal(sink)
    alloc = Allocation(("192.0.2.50", 5000), "u", b"k", ("192.0.2.10", 40000), 4, 700.0)
    alloc.permissions = {"192.0.2.60": 400.0, "192.0.2.61": 50.0}
    alloc.channels = {0x4001: Channel(0x4001, ("192.0.2.60", 7), 300.0)}
    journal.changed("udp", alloc, 100.0, [7])
    journal.deleted("udp", alloc.client)
    [(listener, record, fds)] = sink.records
    assert (listener, fds) == ("udp", 1)
    assert record.expires_in_s == 600.0
    assert record.permissions == {"192.0.2.60": 300.0}
    assert record.channels == (ChannelRecord(0x4001, ("192.0.2.60", 7), 200.0),)
    assert sink.gone == [("udp", ("192.0.2.50", 5000))]


def dual_allocation() -> Allocation:
    alloc = Allocation(("192.0.2.50", 5000), "u", b"k", ("192.0.2.10", 40000), 4, 700.0)
    alloc.additional = ("2001:db8::10", 40002)
    alloc.permissions = {"192.0.2.60": 400.0, "192.0.2.61": 50.0}
    alloc.channels = {
        0x4001: Channel(0x4001, ("192.0.2.60", 7), 300.0),
        0x4002: Channel(0x4002, ("192.0.2.61", 8), 90.0),
    }
    return alloc


def record_text(alloc: Allocation, now: float) -> bytes:
    """What the journal must write: the record's document through `json`."""
    return record_bytes(allocation_doc(record_of(alloc, now)))


def odd_allocation() -> Allocation:
    """Names that JSON escapes, a key of every byte, endless, huge and tiny lifetimes, TCP."""
    alloc = Allocation(
        ("::ffff:192.0.2.50", 65535),
        'us"er\\\u00e9\U0001f4de\n',
        bytes(range(256)),
        ("2001:db8::10", 0),
        6,
        float("inf"),
        "name\t\u0000\u2028",
        tcp=True,
    )
    alloc.permissions = {"2001:db8::\u00e9": 1e300, "192.0.2.61": 7, "192.0.2.62": 1e-9}
    alloc.channels = {0x7FFF: Channel(0x7FFF, ('"', 1), float("inf"))}
    return alloc


def integer_allocation() -> Allocation:
    """Lifetimes on an integer clock (json writes them as integers)."""
    alloc = Allocation(("192.0.2.50", 5000), "u", b"", ("192.0.2.10", 40000), 4, 700)
    alloc.permissions = {"192.0.2.60": 400}
    alloc.channels = {0x4001: Channel(0x4001, ("192.0.2.60", 7), 300)}
    return alloc


@pytest.mark.parametrize("make", [dual_allocation, odd_allocation, integer_allocation])
@pytest.mark.parametrize("now", [0.0, 1.0 / 3.0, 100.0, 350.0, 800.0, 123456.789, 0, 100, 700])
def test_the_journal_writes_a_live_allocation_as_json_encodes_its_document_byte_for_byte(
    make: Callable[[], Allocation], now: float
) -> None:
    alloc = make()
    assert record_json(alloc, now) == record_text(alloc, now)
    assert json.loads(record_json(alloc, now)) == allocation_doc(record_of(alloc, now))


def test_an_allocation_with_no_permission_or_channel_left_writes_empty_ones() -> None:
    alloc = dual_allocation()
    assert json.loads(record_json(alloc, 1000.0))["permissions"] == {}
    assert json.loads(record_json(alloc, 1000.0))["channels"] == []
    assert record_json(alloc, 1000.0) == record_text(alloc, 1000.0)
