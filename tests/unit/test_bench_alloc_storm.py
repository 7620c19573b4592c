"""`bench turn`'s allocation storm (bench/alloc_storm.py): messages, answers, figures, ratios."""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections import Counter

import pytest

from support.bench_modules import bench_module


def test_an_unauthenticated_allocate_asks_for_udp_and_nothing_else() -> None:
    storm = bench_module("alloc_storm")
    msg = storm.allocate_request(b"t" * 12)
    assert struct.unpack_from("!HHI", msg) == (0x0003, 8, 0x2112A442)
    assert msg[8:20] == b"t" * 12
    assert msg[20:] == struct.pack("!HHBBH", 0x0019, 4, 17, 0, 0)


def test_a_signed_allocate_carries_an_integrity_over_the_message_before_it() -> None:
    storm = bench_module("alloc_storm")
    key = storm.long_term_key("user1", "realm", "pass")
    assert key == hashlib.md5(b"user1:realm:pass").digest()
    msg = storm.allocate_request(b"t" * 12, username="user1", realm="realm", nonce=b"n0", key=key)
    length = struct.unpack_from("!H", msg, 2)[0]
    assert len(msg) == 20 + length
    assert msg[-24:-20] == struct.pack("!HH", 0x0008, 20)
    assert msg[-20:] == hmac.new(key, msg[:-24], hashlib.sha1).digest()


def test_a_401_answer_gives_its_code_realm_and_nonce() -> None:
    storm = bench_module("alloc_storm")
    attrs = (
        struct.pack("!HHHBB", 0x0009, 16, 0, 4, 1) + b"Unauthorized"
        + struct.pack("!HH", 0x0014, 5) + b"realm\x00\x00\x00"
        + struct.pack("!HH", 0x0015, 4) + b"abcd"
    )  # fmt: skip
    data = struct.pack("!HHI", 0x0113, len(attrs), 0x2112A442) + b"x" * 12 + attrs
    answer = storm.parse_answer(data)
    assert (answer.kind, answer.code, answer.realm, answer.nonce) == (0x0113, 401, "realm", b"abcd")
    assert answer.transaction == b"x" * 12


@pytest.mark.parametrize(
    "data",
    [b"", b"\x01\x03\x00\x00" + b"\x00" * 16, b"\x01\x03\x00\x08\x21\x12\xa4\x42" + b"0" * 12],
)
def test_what_is_no_whole_stun_message_is_no_answer(data: bytes) -> None:
    assert bench_module("alloc_storm").parse_answer(data) is None


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([5.0, 1.0, 3.0, 2.0, 4.0], 0.5, 3.0), (list(range(1, 101)), 0.99, 99), ([7.0], 0.99, 7.0)],
)
def test_percentile_is_the_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert bench_module("alloc_storm").percentile(values, q) == expected


def test_ratio_lines_compare_ours_with_upstream_and_coturn_per_allocation() -> None:
    storm = bench_module("alloc_storm")
    results = {
        "stunnerd": storm.StormResult("stunnerd", 100, 100, 1.0, 0.2),
        "upstream x1": storm.StormResult("upstream x1", 100, 100, 1.0, 0.4),
        "coturn": storm.StormResult("coturn", 100, 100, 1.0, 0.1),
        "failed": storm.StormResult("failed", 100, 0, 1.0, 0.1, failures=Counter(timeout=100)),
    }
    lines = storm.ratio_lines(results)
    assert lines == [
        "RATIO storm cpu_per_allocation ours/upstream = 0.50  "
        "(ours: stunnerd; upstream: upstream x1)",
        "RATIO storm cpu_per_allocation ours/coturn = 2.00  (ours: stunnerd; coturn: coturn)",
    ]
    assert results["stunnerd"].per_cpu_s == 500
    report = storm.report_lines(results)
    assert any("failures: {'timeout': 100}" in line for line in report)


@pytest.mark.parametrize(
    ("where", "bucket"),
    [
        ("~:0:<method 'sendto' of '_socket.socket' objects>", "sendto (answers)"),
        ("~:0:<built-in method _hashlib.hmac_new>", "HMAC and key (auth)"),
        ("/x/stunnerd/turn/engine.py:10:handle", "TURN engine"),
        ("/x/stunnerd/handoff/transport/journal.py:3:append", "journal (workers)"),
        ("/x/lib/python3.11/logging/__init__.py:1:debug", "logging"),
        ("/x/stunnerd/net/allocate.py:5:open_relay", "relay socket set-up"),
        ("/x/somewhere.py:1:f", "other"),
    ],
)
def test_profile_functions_fall_into_buckets(where: str, bucket: str) -> None:
    assert bench_module("alloc_storm").bucket_of(where) == bucket
