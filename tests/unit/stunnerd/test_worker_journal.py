"""The journal a worker keeps in its supervisor: records and relay sockets over a real socket
pair, aged and handed to a replacement as a handoff document the replacement reads."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace

import pytest

from stunnerd.handoff.transport.journal import Journal, JournalWriter
from stunnerd.handoff.transport.state import AllocationRecord, ChannelRecord, decode_state
from stunnerd.workers.sockets import FdChannel

CLIENT = ("203.0.113.7", 40000)
RELAY = ("192.0.2.1", 50000)


@pytest.fixture
def channel() -> Iterator[tuple[JournalWriter, FdChannel, Journal]]:
    ours, theirs = FdChannel.pair()
    worker = FdChannel(theirs)
    journal = Journal()
    yield JournalWriter(worker), ours, journal
    journal.close()
    ours.close()
    worker.close()


def record(expires_in_s: float = 600.0, client: tuple[str, int] = CLIENT) -> AllocationRecord:
    return AllocationRecord(
        client=client,
        user_id="user1",
        key=b"k" * 16,
        username="user1",
        relay=RELAY,
        family=4,
        expires_in_s=expires_in_s,
        permissions={"10.0.0.5": 300.0, "10.0.0.6": 20.0},
        channels=(ChannelRecord(0x4001, ("10.0.0.5", 7000), 600.0),),
    )


def relay_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def test_a_new_allocation_is_kept_with_a_copy_of_its_relay_socket(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    with relay_socket() as relay:
        writer.changed("a", record(), [relay.fileno()])
        writer.changed("a", record(500.0), [])  # a refresh: the socket stays
        journal.read(ours)
        (entry,) = journal.entries.values()
        assert entry.record["expires_in_s"] == 500.0
        assert [s.getsockname() for s in entry.sockets] == [relay.getsockname()]
    # The worker's socket is gone; the supervisor's copy still holds the port.
    held = entry.sockets[0].getsockname()
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again,
        pytest.raises(OSError, match="in use"),
    ):
        again.bind(held)
    assert journal.received == 2
    assert writer.sent_bytes == journal.received_bytes < 1000


def test_a_deleted_allocation_releases_its_relay_socket(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    with relay_socket() as relay:
        writer.changed("a", record(), [relay.fileno()])
        address = relay.getsockname()
    writer.deleted("a", CLIENT)
    journal.read(ours)
    assert len(journal) == 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
        again.bind(address)  # the port is free again


def test_the_handover_ages_the_records_and_drops_the_expired_and_the_unconfigured(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    sockets = [relay_socket() for _ in range(3)]
    try:
        writer.changed("a", record(600.0), [sockets[0].fileno()])
        writer.changed("a", record(5.0, ("203.0.113.8", 1)), [sockets[1].fileno()])
        writer.changed("gone", record(600.0, ("203.0.113.9", 1)), [sockets[2].fileno()])
        journal.read(ours)
        at = max(entry.at for entry in journal.entries.values())
        document, fds = journal.handover(["a"], b"n" * 32, now=at + 30.0)
    finally:
        for sock in sockets:
            sock.close()
    state = decode_state(document.encode())
    (listener,) = state.listeners
    (alloc,) = listener.allocations
    assert (listener.name, alloc.client) == ("a", CLIENT)
    assert 569.0 < alloc.expires_in_s <= 570.0
    assert list(alloc.permissions) == ["10.0.0.5"]  # the other one expired meanwhile
    assert state.nonce_key == b"n" * 32
    assert len(fds) == 1
    assert len(journal) == 1


def test_a_dual_allocation_keeps_both_relay_sockets_and_needs_both(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    dual = replace(record(), additional=("2001:db8::1", 50002))
    with relay_socket() as v4, relay_socket() as v6:
        writer.changed("a", dual, [v4.fileno(), v6.fileno()])
        journal.read(ours)
    document, fds = journal.handover(["a"], b"n" * 32)
    assert len(fds) == 2
    (alloc,) = decode_state(document.encode()).listeners[0].allocations
    assert alloc.additional == ("2001:db8::1", 50002)
    # An entry that lost one of its sockets cannot be adopted: it is dropped.
    (entry,) = journal.entries.values()
    entry.sockets.pop().close()
    document, fds = journal.handover(["a"], b"n" * 32)
    assert fds == []
    assert len(journal) == 0


def test_a_record_the_replacement_could_not_read_is_left_out_alone(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    with relay_socket() as good, relay_socket() as bad:
        writer.changed("a", record(), [good.fileno()])
        writer.changed("a", replace(record(), client=("203.0.113.8", 1), family=5), [bad.fileno()])
        journal.read(ours)
    document, fds = journal.handover(["a"], b"n" * 32)
    (alloc,) = decode_state(document.encode()).listeners[0].allocations
    assert alloc.client == CLIENT
    assert len(fds) == 1


def test_a_record_too_large_for_one_message_is_not_sent_and_the_journal_goes_on(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    many = {f"10.{i // 65536}.{i // 256 % 256}.{i % 256}": 300.0 for i in range(4000)}
    with relay_socket() as big, relay_socket() as small:
        with pytest.raises(OSError, match="too large"):
            writer.changed("a", replace(record(), permissions=many), [big.fileno()])
        writer.changed("a", record(client=("203.0.113.8", 1)), [small.fileno()])
        journal.read(ours)
    assert [key[1] for key in journal.entries] == [("203.0.113.8", 1)]
