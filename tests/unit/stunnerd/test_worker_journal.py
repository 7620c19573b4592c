"""The journal a worker keeps in its supervisor: records and relay sockets over a real socket
pair, aged and handed to a replacement as a handoff document the replacement reads."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import pytest

from stunner_common.contracts.worker_messages import (
    MAX_CHANNEL_FDS,
    MAX_CHANNEL_MESSAGE_BYTES,
    JournalBatch,
    JournalDelete,
    JournalEntry,
    encode,
)
from stunnerd.handoff.transport.journal import Journal, JournalWriter
from stunnerd.handoff.transport.records import record_bytes
from stunnerd.handoff.transport.state import (
    AllocationRecord,
    ChannelRecord,
    allocation_doc,
    decode_state,
)
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


def change(writer: JournalWriter, listener: str, rec: AllocationRecord, fds: Sequence[int]) -> None:
    """Journal `rec` as the worker's listeners do, as its document's JSON."""
    writer.changed(listener, rec.client, record_bytes(allocation_doc(rec)), fds)


def bound(fd: int) -> tuple[str, int]:
    """The address of the socket behind `fd` (left open)."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        name: tuple[str, int] = sock.getsockname()
        return name


def worker_end(writer: JournalWriter) -> FdChannel:
    """The worker's end of the channel the writer sends on."""
    assert isinstance(writer.channel, FdChannel)
    return writer.channel


def relay_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def test_a_new_allocation_is_kept_with_a_copy_of_its_relay_socket(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    with relay_socket() as relay:
        change(writer, "a", record(), [relay.fileno()])
        change(writer, "a", record(500.0), [])  # a refresh: the socket stays
        journal.read(ours)
        ((text, _at, fds),) = journal.entries.values()
        assert json.loads(text)["expires_in_s"] == 500.0
        assert [bound(fd) for fd in fds] == [relay.getsockname()]
    # The worker's socket is gone; the supervisor's copy still holds the port.
    held = bound(fds[0])
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
        change(writer, "a", record(), [relay.fileno()])
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
        change(writer, "a", record(600.0), [sockets[0].fileno()])
        change(writer, "a", record(5.0, ("203.0.113.8", 1)), [sockets[1].fileno()])
        change(writer, "gone", record(600.0, ("203.0.113.9", 1)), [sockets[2].fileno()])
        journal.read(ours)
        at = max(at for _text, at, _fds in journal.entries.values())
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
        change(writer, "a", dual, [v4.fileno(), v6.fileno()])
        journal.read(ours)
    document, fds = journal.handover(["a"], b"n" * 32)
    assert len(fds) == 2
    (alloc,) = decode_state(document.encode()).listeners[0].allocations
    assert alloc.additional == ("2001:db8::1", 50002)
    # An entry that lost one of its sockets cannot be adopted: it is dropped.
    ((key, (text, at, held)),) = journal.entries.items()
    os.close(held[1])
    journal.entries[key] = (text, at, held[:1])
    document, fds = journal.handover(["a"], b"n" * 32)
    assert fds == []
    assert len(journal) == 0


def test_a_record_the_replacement_could_not_read_is_left_out_alone(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    with relay_socket() as good, relay_socket() as bad:
        change(writer, "a", record(), [good.fileno()])
        change(writer, "a", replace(record(), client=("203.0.113.8", 1), family=5), [bad.fileno()])
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
            change(writer, "a", replace(record(), permissions=many), [big.fileno()])
        change(writer, "a", record(client=("203.0.113.8", 1)), [small.fileno()])
        journal.read(ours)
    assert [key[1] for key in journal.entries] == [("203.0.113.8", 1)]


class Turn:
    """A stand-in for the event loop's `call_soon`: what is scheduled runs when the turn ends."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []

    def schedule(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def end(self) -> None:
        soon, self.soon = self.soon, []
        for callback in soon:
            callback()


@pytest.fixture
def batched() -> Iterator[tuple[JournalWriter, FdChannel, Journal, Turn]]:
    ours, theirs = FdChannel.pair()
    worker = FdChannel(theirs)
    journal, turn = Journal(), Turn()
    yield JournalWriter(worker, turn.schedule), ours, journal, turn
    journal.close()
    ours.close()
    worker.close()


def test_the_changes_of_one_turn_travel_as_one_message_with_every_fd_in_order(
    batched: tuple[JournalWriter, FdChannel, Journal, Turn],
) -> None:
    writer, ours, journal, turn = batched
    clients = [("203.0.113.7", 40000 + i) for i in range(5)]
    sockets = [relay_socket() for _ in clients]
    try:
        for client, sock in zip(clients, sockets, strict=True):
            change(writer, "a", record(client=client), [sock.fileno()])
        change(writer, "a", record(500.0, clients[0]), [])
        writer.deleted("a", clients[1])
        journal.read(ours)
        assert journal.received == 0  # nothing before the turn ends
        turn.end()
        addresses = {
            client: sock.getsockname() for client, sock in zip(clients, sockets, strict=True)
        }
    finally:
        for sock in sockets:
            sock.close()  # the allocations close theirs: the queued duplicates were sent
    journal.read(ours)
    assert (writer.sent, journal.received) == (1, 1)
    assert sorted(key[1] for key in journal.entries) == [clients[0], *clients[2:]]
    for (_listener, client), (_text, _at, fds) in journal.entries.items():
        assert [bound(fd) for fd in fds] == [addresses[client]]
    assert json.loads(journal.entries[("a", clients[0])][0])["expires_in_s"] == 500.0


def test_an_allocation_closed_before_its_turn_ends_is_still_journaled_with_its_own_socket(
    batched: tuple[JournalWriter, FdChannel, Journal, Turn],
) -> None:
    writer, ours, journal, turn = batched
    with relay_socket() as relay:
        change(writer, "a", record(), [relay.fileno()])
        address = relay.getsockname()
    with relay_socket() as other:  # may take the closed socket's fd number
        turn.end()
        journal.read(ours)
        ((_text, _at, fds),) = journal.entries.values()
        assert [bound(fd) for fd in fds] == [address] != [other.getsockname()]


def test_a_batch_is_sent_early_when_it_would_outgrow_a_message_or_its_fds(
    batched: tuple[JournalWriter, FdChannel, Journal, Turn],
) -> None:
    writer, ours, journal, turn = batched
    count = MAX_CHANNEL_FDS + 10
    sockets = [relay_socket() for _ in range(count)]
    try:
        for i, sock in enumerate(sockets):
            change(writer, "a", record(client=("203.0.113.7", i + 1)), [sock.fileno()])
            journal.read(ours)
        turn.end()
        journal.read(ours)
    finally:
        for sock in sockets:
            sock.close()
    assert len(journal) == count
    assert writer.sent == journal.received >= 2
    assert writer.sent_bytes == journal.received_bytes
    assert journal.received_bytes <= writer.sent * MAX_CHANNEL_MESSAGE_BYTES


def test_the_worker_answers_only_after_what_it_journaled_before_is_sent(
    batched: tuple[JournalWriter, FdChannel, Journal, Turn],
) -> None:
    writer, ours, journal, turn = batched
    with relay_socket() as relay:
        change(writer, "a", record(), [relay.fileno()])
        writer.flush()  # as the worker does before each answer to its supervisor
        journal.read(ours)
        assert len(journal) == 1
        turn.end()  # the scheduled flush finds nothing left
    assert writer.sent == 1


def test_a_message_that_is_not_a_journal_batch_or_miscounts_its_fds_changes_nothing(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    worker = worker_end(writer)
    with relay_socket() as relay:
        change(writer, "a", record(), [relay.fileno()])
        text = record_bytes(allocation_doc(record(client=("203.0.113.8", 1))))
        one_fd_short = JournalBatch((JournalEntry("a", ("203.0.113.8", 1), 1.0, text, 2),))
        worker.send_many(one_fd_short, [relay.fileno()])
        socket.send_fds(worker.sock, [b"{not json"], [relay.fileno()])
        worker.send_many(JournalBatch((JournalDelete("a", ("203.0.113.9", 1)),)), [])
        journal.read(ours)
    assert [key[1] for key in journal.entries] == [CLIENT]
    assert journal.received == 4


def test_a_batch_cut_short_is_left_out_whole_with_its_fds_and_the_next_one_is_read(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    writer, ours, journal = channel
    worker = worker_end(writer)
    text = record_bytes(allocation_doc(record(client=("203.0.113.8", 1))))
    cut = encode(
        JournalBatch(
            (JournalEntry("a", ("203.0.113.8", 1), 1.0, text, 1), JournalDelete("a", CLIENT))
        )
    )[:-3]
    with relay_socket() as relay:
        change(writer, "a", record(), [relay.fileno()])
        socket.send_fds(worker.sock, [cut], [relay.fileno()])
        change(writer, "a", record(500.0), [])
        open_before = len(os.listdir("/proc/self/fd"))
        journal.read(ours)
        assert len(os.listdir("/proc/self/fd")) == open_before + 1  # CLIENT's copy, no other
    ((key, (text, _at, fds)),) = journal.entries.items()
    assert key == ("a", CLIENT)  # neither the cut batch's entry nor its delete
    assert json.loads(text)["expires_in_s"] == 500.0  # the batch after it was read
    assert len(fds) == 1
    assert journal.received == 3


def test_ten_thousand_kept_allocations_are_not_walked_by_the_garbage_collector(
    channel: tuple[JournalWriter, FdChannel, Journal],
) -> None:
    _writer, _ours, journal = channel
    text = record_bytes(allocation_doc(record()))
    for i in range(10_000):
        journal.keep("a", ("203.0.113.7", i), 1.0, text, ())
    gc.collect()
    gc.collect()  # a key's outer tuple is let go once its client tuple was
    untracked = [entry for entry in journal.entries.values() if not gc.is_tracked(entry)]
    assert len(untracked) == len(journal)
    assert not any(gc.is_tracked(key) for key in journal.entries)


def test_a_change_that_finds_no_free_fd_is_refused_and_holds_none(
    batched: tuple[JournalWriter, FdChannel, Journal, Turn],
) -> None:
    writer, ours, journal, turn = batched
    dual = replace(record(), additional=("2001:db8::1", 50002))
    with relay_socket() as v4, relay_socket() as v6:
        lowest = os.dup(0)
        os.close(lowest)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest + 1, hard))  # room for one more fd
        try:
            with pytest.raises(OSError, match="Too many open files"):
                change(writer, "a", dual, [v4.fileno(), v6.fileno()])
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        again = os.dup(0)
        os.close(again)
        assert again == lowest  # the first duplicate was closed again
        change(writer, "a", record(client=("203.0.113.8", 1)), [v4.fileno()])
        turn.end()
        journal.read(ours)
    assert [key[1] for key in journal.entries] == [("203.0.113.8", 1)]


def test_batches_of_names_that_escape_long_still_fit_a_message(
    batched: tuple[JournalWriter, FdChannel, Journal, Turn],
) -> None:
    """A character beyond the BMP is one character in Python and twelve in the JSON that
    carries it: the writer's bound counts it so, and no batch is refused for its size."""
    writer, ours, journal, turn = batched
    listener = "\U0001f4de" * 200
    count = 2000
    for i in range(count):
        change(writer, listener, record(client=("203.0.113.7", i + 1)), [])
        journal.read(ours)
    turn.end()
    journal.read(ours)
    assert len(journal) == count
    assert writer.sent == journal.received >= 2


def test_a_batch_waits_for_room_on_a_full_channel_for_a_bounded_while_then_goes(
    batched: tuple[JournalWriter, FdChannel, Journal, Turn], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, ours, journal, turn = batched
    monkeypatch.setattr("stunnerd.workers.sockets.CHANNEL_TIMEOUT_S", 0.05)
    worker = worker_end(writer)
    worker.sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):  # fill the channel: the supervisor reads nothing
        while True:
            worker.sock.send(bytes(4096))
    change(writer, "a", record(), [])
    turn.end()  # the batch waits for room until the timeout, and is left out (logged)
    assert writer.sent == 0
    with contextlib.suppress(BlockingIOError):  # the supervisor catches up
        while True:
            ours.sock.recv(MAX_CHANNEL_MESSAGE_BYTES, socket.MSG_DONTWAIT)
    change(writer, "a", record(), [])
    turn.end()
    journal.read(ours)
    assert writer.sent == 1
    assert len(journal) == 1
