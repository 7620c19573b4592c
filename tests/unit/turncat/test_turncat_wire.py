"""turncat's TURN framing and message helpers: pure functions over bytes."""

from __future__ import annotations

import pytest
from aioice import stun

from stunner_common.auth import long_term_key
from turncat.wire import (
    LongTermAuth,
    build_request,
    error_of,
    integrity_ok,
    parse_stun,
)


def test_signed_request_verifies_with_the_long_term_key() -> None:
    auth = LongTermAuth.derive("user1", "passwd1", "stunner.l7mp.io", b"nonce")
    assert auth.key == long_term_key("user1", "stunner.l7mp.io", "passwd1")
    msg = build_request(stun.Method.ALLOCATE, {"LIFETIME": 600}, auth)
    parsed = parse_stun(bytes(msg))
    assert parsed is not None
    assert parsed.attributes["USERNAME"] == "user1"
    assert parsed.attributes["REALM"] == "stunner.l7mp.io"
    assert parsed.attributes["NONCE"] == b"nonce"
    assert integrity_ok(parsed, auth.key)
    assert not integrity_ok(parsed, b"another key")


def test_unsigned_message_passes_the_integrity_check() -> None:
    parsed = parse_stun(bytes(build_request(stun.Method.BINDING)))
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
