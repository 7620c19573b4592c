"""turncat's TURN framing and message helpers: pure functions over bytes."""

from __future__ import annotations

import pytest
from aioice import stun

from stunner_common.auth import long_term_key
from stunner_common.framing import stream_frame_length
from stunner_common.stun import FAMILY_IPV6, Method, encode
from turncat.wire import LongTermAuth, build_request, error_of, integrity_ok, parse_stun


def test_signed_request_verifies_with_the_long_term_key() -> None:
    auth = LongTermAuth.derive("user1", "passwd1", "stunner.l7mp.io", b"nonce")
    assert auth.key == long_term_key("user1", "stunner.l7mp.io", "passwd1")
    msg = build_request(Method.ALLOCATE, {"LIFETIME": 600}, auth)
    parsed = parse_stun(bytes(msg))
    assert parsed is not None
    assert parsed.attributes["USERNAME"] == "user1"
    assert parsed.attributes["REALM"] == "stunner.l7mp.io"
    assert parsed.attributes["NONCE"] == b"nonce"
    assert integrity_ok(parsed, auth.key)
    assert not integrity_ok(parsed, b"another key")


def test_unsigned_message_passes_the_integrity_check() -> None:
    parsed = parse_stun(bytes(build_request(Method.BINDING)))
    assert parsed is not None
    assert integrity_ok(parsed, b"any")


@pytest.mark.parametrize(
    "garbage", [b"", b"\x00" * 19, b"\x00\x01\x00\x08" + b"\x00" * 16, b"\xff" * 40]
)
def test_malformed_stun_parses_to_none(garbage: bytes) -> None:
    assert parse_stun(garbage) is None


def test_error_of_reads_code_and_reason() -> None:
    msg = stun.Message(stun.Method.ALLOCATE, stun.Class.ERROR)
    assert error_of(msg) == (0, "error response without ERROR-CODE")
    msg.attributes["ERROR-CODE"] = (401, "Unauthorized")
    assert error_of(msg) == (401, "Unauthorized")


def test_requests_of_known_methods_are_byte_identical_to_aioices() -> None:
    auth = LongTermAuth.derive("user1", "passwd1", "stunner.l7mp.io", b"nonce")
    attrs = {"REQUESTED-TRANSPORT": 17 << 24, "LIFETIME": 600}
    ours = build_request(Method.ALLOCATE, attrs, auth)
    theirs = stun.Message(
        stun.Method.ALLOCATE,
        stun.Class.REQUEST,
        ours.transaction_id,
        {**attrs, "USERNAME": "user1", "REALM": "stunner.l7mp.io", "NONCE": b"nonce"},
    )
    theirs.add_message_integrity(auth.key)
    assert bytes(ours) == bytes(theirs)
    assert stun.parse_message(bytes(ours)).check_message_integrity(auth.key)


def test_rfc6062_methods_and_attributes_round_trip() -> None:
    auth = LongTermAuth.derive("user1", "passwd1", "stunner.l7mp.io", b"nonce")
    connect = build_request(Method.CONNECT, {"XOR-PEER-ADDRESS": ("::1", 8080)}, auth)
    raw = bytes(connect)
    assert int.from_bytes(raw[:2], "big") == 0x000A  # RFC 6062 §6.1: Connect request
    parsed = parse_stun(raw)
    assert parsed is not None
    assert parsed.message_method == Method.CONNECT
    assert parsed.attributes["XOR-PEER-ADDRESS"] == ("::1", 8080)
    assert integrity_ok(parsed, auth.key)

    bind = parse_stun(bytes(build_request(Method.CONNECTION_BIND, {"CONNECTION-ID": 0xDEADBEEF})))
    assert bind is not None
    assert bind.message_method == Method.CONNECTION_BIND
    assert bind.attributes["CONNECTION-ID"] == 0xDEADBEEF

    family = build_request(Method.ALLOCATE, {"REQUESTED-ADDRESS-FAMILY": FAMILY_IPV6})
    assert b"\x00\x17\x00\x04\x02\x00\x00\x00" in bytes(family)  # RFC 8656 §18.11


def test_responses_of_unknown_methods_parse_with_the_raw_number() -> None:
    raw = encode(0x00D, stun.Class.RESPONSE, b"t" * 12, {"LIFETIME": 1})
    parsed = parse_stun(raw)
    assert parsed is not None
    assert parsed.message_method == 0x00D
    assert parsed.method_name == "method 0xd"
    assert stream_frame_length(raw[:20]) == len(raw)


def test_a_wrong_fingerprint_or_a_truncated_attribute_is_malformed() -> None:
    raw = bytearray(bytes(build_request(Method.BINDING, {"LIFETIME": 5})))
    raw[-1] ^= 1
    assert parse_stun(bytes(raw)) is None
    truncated = b"\x00\x01\x00\x08" + stun.COOKIE.to_bytes(4, "big") + b"t" * 12
    assert parse_stun(truncated + b"\x00\x0d\x00\x08abcd") is None  # LIFETIME claims 8 bytes
    assert parse_stun(truncated + b"\x00\x0d\x00\x04abcd") is not None
