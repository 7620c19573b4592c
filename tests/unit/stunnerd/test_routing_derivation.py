"""What `stunnerd.routing` derives from a config for the edge (protected ranges with stunnerd's
own addresses, the quota's terms, the STRICT_DNS names kept), and the journal that turns a live
allocation into the handoff document's record
(`stunnerd.handoff.transport.records.RecordJournal`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stunner_common.config import StunnerConfig, parse_config
from stunnerd.handoff.transport.records import RecordJournal, record_doc, record_of
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
        self, listener: str, client: Address, doc: Mapping[str, Any], fds: Sequence[int]
    ) -> None:
        record = read_allocation(dict(doc), listener)
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


def test_the_journal_document_of_a_live_allocation_is_its_records_document() -> None:
    alloc = Allocation(("192.0.2.50", 5000), "u", b"k", ("192.0.2.10", 40000), 4, 700.0)
    alloc.additional = ("2001:db8::10", 40002)
    alloc.permissions = {"192.0.2.60": 400.0, "192.0.2.61": 50.0}
    alloc.channels = {
        0x4001: Channel(0x4001, ("192.0.2.60", 7), 300.0),
        0x4002: Channel(0x4002, ("192.0.2.61", 8), 90.0),
    }
    for now in (0.0, 100.0, 350.0, 800.0):
        assert record_doc(alloc, now) == allocation_doc(record_of(alloc, now))
