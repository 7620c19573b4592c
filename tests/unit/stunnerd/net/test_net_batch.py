"""The UDP send batcher on fake sockets: what goes out at once, what waits for the loop turn, and
how a burst is cut into UDP GSO sends (one `sendmsg` per run of equal-size datagrams)."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from stunnerd.net import batch
from stunnerd.net.batch import BURST_GAP_S, GSO_MAX_SEGMENTS, SendBatcher
from support.fake_net import FakeSocket, MockLoop

DEST = ("198.51.100.7", 5000)
OTHER = ("198.51.100.8", 5000)


class Clock:
    """The batcher's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(batch, "_monotonic", clock)
    return clock


class RefusedGso:
    """`sendmsg` of a kernel without UDP GSO."""

    def __call__(self, *_args: object) -> int:
        raise OSError(errno.EIO, "Input/output error")


def burst(batcher: SendBatcher, sock: Any, payloads: list[bytes]) -> None:
    for data in payloads:
        batcher.send(sock, data, DEST)


def test_a_disabled_batcher_sends_each_datagram_at_once(loop: MockLoop) -> None:
    sock: Any = FakeSocket()
    batcher = SendBatcher(loop, enabled=False)  # type: ignore[arg-type]
    burst(batcher, sock, [b"a", b"b"])
    assert sock.sent == [(b"a", DEST), (b"b", DEST)]
    assert loop.ready == []


def test_a_send_that_fails_is_dropped_as_udp_may(loop: MockLoop, clock: Clock) -> None:
    sock: Any = FakeSocket()
    sock.fail_with = BlockingIOError(errno.EAGAIN, "full")
    for enabled in (False, True):
        batcher = SendBatcher(loop, enabled=enabled)  # type: ignore[arg-type]
        batcher.send(sock, b"lost", DEST)
    assert sock.sent == []


def test_a_lone_datagram_goes_out_at_once_and_a_burst_waits_for_the_loop_turn(
    loop: MockLoop, clock: Clock
) -> None:
    sock: Any = FakeSocket()
    batcher = SendBatcher(loop)  # type: ignore[arg-type]
    batcher.send(sock, b"first", DEST)
    assert sock.sent == [(b"first", DEST)]
    burst(batcher, sock, [b"12345", b"67890", b"abcde"])  # within BURST_GAP_S: a burst
    assert sock.sent == [(b"first", DEST)]
    assert sock.segmented == []
    loop.run_ready()
    assert sock.segmented == [(b"1234567890abcde", 5, DEST)]


def test_datagrams_further_apart_than_the_burst_gap_are_never_held(
    loop: MockLoop, clock: Clock
) -> None:
    sock: Any = FakeSocket()
    batcher = SendBatcher(loop)  # type: ignore[arg-type]
    for data in (b"a", b"b", b"c"):
        batcher.send(sock, data, DEST)
        clock.now += 2 * BURST_GAP_S
        loop.run_ready()
    assert sock.payloads() == [b"a", b"b", b"c"]
    assert sock.segmented == []


def test_each_destination_has_its_own_queue(loop: MockLoop, clock: Clock) -> None:
    sock: Any = FakeSocket()
    batcher = SendBatcher(loop)  # type: ignore[arg-type]
    for i in range(4):
        batcher.send(sock, b"a%d" % i, DEST)
        batcher.send(sock, b"b%d" % i, OTHER)
    loop.run_ready()
    to_dest = [(d, s) for d, s, to in sock.segmented if to == DEST]
    to_other = [(d, s) for d, s, to in sock.segmented if to == OTHER]
    assert to_dest == [(b"a1a2a3", 2)]
    assert to_other == [(b"b1b2b3", 2)]


@pytest.mark.parametrize(
    ("sizes", "runs"),
    [
        ([10, 10, 10], [(10, 3)]),
        ([10, 10, 4], [(10, 3)]),  # a shorter final segment rides along
        ([10, 4, 10], [(10, 2), (10, 1)]),  # but ends its run
        ([4, 10, 10], [(4, 1), (10, 2)]),  # a longer one starts a new run
        ([10, 0, 10], [(10, 1), (0, 1), (10, 1)]),  # an empty datagram goes alone
        ([8] * (GSO_MAX_SEGMENTS + 6), [(8, GSO_MAX_SEGMENTS), (8, 6)]),
    ],
)
def test_a_burst_is_cut_into_runs_of_equal_size(
    loop: MockLoop, clock: Clock, sizes: list[int], runs: list[tuple[int, int]]
) -> None:
    sock: Any = FakeSocket()
    batcher = SendBatcher(loop)  # type: ignore[arg-type]
    batcher.send(sock, b"lead", DEST)  # sent at once; what follows is a burst
    payloads = [bytes([65 + i % 26]) * size for i, size in enumerate(sizes)]
    burst(batcher, sock, payloads)
    loop.run_ready()
    sent = [(len(data), 1) for data, _ in sock.sent[1:]]
    sent += [(size, -(-len(data) // size)) for data, size, _ in sock.segmented]
    assert sorted(sent) == sorted(runs)
    assert sorted(sock.payloads()[1:]) == sorted(payloads)


def test_a_kernel_that_refuses_gso_switches_batching_off_and_loses_nothing(
    loop: MockLoop, clock: Clock
) -> None:
    sock: Any = FakeSocket()
    sock.sendmsg = RefusedGso()
    batcher = SendBatcher(loop)  # type: ignore[arg-type]
    burst(batcher, sock, [b"one", b"two", b"six"])
    loop.run_ready()
    assert not batcher.enabled
    assert sock.payloads() == [b"one", b"two", b"six"]
