"""The checks that run before any decoding, and the per-source challenge budget."""

from __future__ import annotations

import hashlib
import os
import struct

import pytest
from aioice import stun

from stunnerd.turn import precheck
from stunnerd.turn.codec import StunBadRequestError, StunDecodeError
from stunnerd.turn.guard import ChallengeBudget

KEY = hashlib.md5(b"user:realm:pass").digest()


def signed(fingerprint: bool = True, **extra: object) -> bytes:
    msg = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
    msg.attributes.update(
        {"REQUESTED-TRANSPORT": 17 << 24, "USERNAME": "user", "REALM": "realm", "NONCE": b"n" * 24}
    )
    msg.attributes.update(extra)
    msg.add_message_integrity(KEY)
    msg.add_fingerprint()
    data = bytes(msg)
    if not fingerprint:
        data = data[:2] + struct.pack("!H", len(data) - 28) + data[4:-8]
    return data


def stuffed(count: int, method: int = 0x0003) -> bytes:
    attrs = b"".join(struct.pack("!HHI", 0x8022, 4, i) for i in range(count))  # SOFTWARE
    return struct.pack("!HHI", method, len(attrs), 0x2112A442) + os.urandom(12) + attrs


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x01\x00\x00\x21\x12\xa4\x43" + b"t" * 12,  # wrong cookie
        b"\x00\x01\x00\x04\x21\x12\xa4\x42" + b"t" * 12,  # length says 4, none follow
        b"\x00\x01\x00\x02\x21\x12\xa4\x42" + b"t" * 12 + b"xx",  # length not a multiple of 4
        b"\xc0\x01\x00\x00\x21\x12\xa4\x42" + b"t" * 12,  # top bits set
        stuffed(200),  # 1620 bytes, over 1500
    ],
)
def test_header_drops_what_is_not_a_stun_message_of_acceptable_size(data: bytes) -> None:
    with pytest.raises(StunDecodeError):
        precheck.header(data, 1500)


def test_header_reads_method_class_and_transaction_id() -> None:
    data = signed()
    head = precheck.header(data, 1500)
    assert (head.method, head.is_request, head.transaction_id) == (
        stun.Method.ALLOCATE,
        True,
        data[8:20],
    )


@pytest.mark.parametrize("fingerprint", [True, False])
def test_integrity_is_found_from_the_tail_and_verified_on_raw_bytes(fingerprint: bool) -> None:
    data = signed(fingerprint)
    at = precheck.integrity_offset(data)
    assert at == len(data) - 24 - (8 if fingerprint else 0)
    assert precheck.integrity_ok(data, at, KEY)
    assert not precheck.integrity_ok(data, at, b"k" * 16)
    assert stun.parse_message(data).check_message_integrity(KEY)  # aioice agrees


def test_a_request_without_integrity_has_no_offset() -> None:
    assert precheck.integrity_offset(stuffed(3)) == -1
    assert precheck.integrity_offset(b"\x00\x03\x00\x00\x21\x12\xa4\x42" + b"t" * 12) == -1


def test_scan_slices_only_what_authentication_needs() -> None:
    data = signed()
    found = precheck.scan(data, precheck.header(data, 1500))
    assert (found.username, found.realm, found.nonce) == (b"user", b"realm", b"n" * 24)
    assert found.integrity_at == precheck.integrity_offset(data)
    assert found.unknown_required == ()


def test_scan_stops_past_the_attribute_limit_with_a_400_for_requests() -> None:
    data = stuffed(41)
    head = precheck.header(data, 1500)
    assert precheck.scan(stuffed(40), precheck.header(stuffed(40), 1500)).integrity_at == -1
    with pytest.raises(StunBadRequestError, match="more than 40 attributes"):
        precheck.scan(data, head)


def test_scan_of_an_over_attributed_response_is_a_silent_drop() -> None:
    data = bytearray(stuffed(41))
    data[0:2] = b"\x01\x03"  # an Allocate success response
    with pytest.raises(StunDecodeError):
        precheck.scan(bytes(data), precheck.header(bytes(data), 1500))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (signed(USERNAME="u" * 600), "USERNAME longer"),
        (signed(fingerprint=False) + b"\x80\x22\x00\x00", "only FINGERPRINT may follow"),
    ],
)
def test_scan_refuses_oversized_credentials_and_attributes_after_integrity(
    data: bytes, reason: str
) -> None:
    if reason.startswith("only"):  # fix the length of the appended message
        data = data[:2] + struct.pack("!H", len(data) - 20) + data[4:]
    with pytest.raises(StunBadRequestError, match=reason):
        precheck.scan(data, precheck.header(data, 1500))


def test_scan_lists_unknown_comprehension_required_types() -> None:
    data = (
        b"\x00\x01\x00\x08\x21\x12\xa4\x42" + b"t" * 12 + b"\x7f\xff\x00\x00" + b"\x00\x1a\x00\x00"
    )
    found = precheck.scan(data, precheck.header(data, 1500))
    assert found.unknown_required == (0x7FFF, 0x001A)


def test_budget_allows_a_burst_then_the_rate_per_source() -> None:
    budget = ChallengeBudget(rate_per_s=10, burst=3)
    assert [budget.allow("192.0.2.1", 0.0) for _ in range(4)] == [True, True, True, False]
    assert budget.allow("192.0.2.2", 0.0)  # another source has its own bucket
    assert not budget.allow("192.0.2.1", 0.05)  # half a token
    assert budget.allow("192.0.2.1", 0.15)
    assert [budget.allow("192.0.2.1", 100.0) for _ in range(4)] == [True, True, True, False]


def test_budget_state_is_bounded_by_evicting_the_least_recent_source() -> None:
    budget = ChallengeBudget(rate_per_s=1, burst=1, max_sources=100)
    for i in range(1000):
        budget.allow(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(budget) == 100
    assert budget.allow("10.0.0.0", 0.0)  # evicted long ago: a fresh bucket


def test_zero_rate_means_unlimited() -> None:
    budget = ChallengeBudget(rate_per_s=0, burst=1)
    assert all(budget.allow("192.0.2.1", 0.0) for _ in range(1000))
    assert len(budget) == 0
