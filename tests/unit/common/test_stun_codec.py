"""The one STUN/TURN codec (stunner_common.stun): RFC 5769 vectors, round trips, integrity,
fingerprint, the RFC 6062 methods, and how a stream tells a STUN frame from ChannelData."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from aioice import stun as aioice_stun

from stunner_common import stun
from stunner_common.framing import channel_data, is_channel_data, stream_frame_length
from support.stun import (
    RFC5769_IPV4_RESPONSE,
    RFC5769_IPV6_RESPONSE,
    RFC5769_LONG_TERM_PASSWORD,
    RFC5769_LONG_TERM_REQUEST,
    RFC5769_PASSWORD,
    RFC5769_REQUEST,
)

TID = bytes.fromhex("b7e7a701bc34d686fa87dfae")
KEY = b"k" * 16


# -- RFC 5769 --------------------------------------------------------------------------------


def test_rfc5769_request_parses_and_verifies_with_its_short_term_key() -> None:
    parsed = stun.parse(RFC5769_REQUEST)
    message = parsed.message
    assert (message.message_method, message.message_class) == (stun.Method.BINDING, 0)
    assert message.transaction_id == TID
    assert message.attributes["USERNAME"] == "evtj:h6vY"
    assert message.attributes["SOFTWARE"] == "STUN test client"
    assert message.attributes["PRIORITY"] == 0x6E0001FF
    assert "FINGERPRINT" in message.attributes
    assert parsed.unknown_required == ()
    assert message.check_message_integrity(RFC5769_PASSWORD)
    assert not message.check_message_integrity(b"VOkJxbRl1RmTxUk/WvJxBu")
    assert bytes(message) == RFC5769_REQUEST


@pytest.mark.parametrize(
    ("raw", "address"),
    [
        (RFC5769_IPV4_RESPONSE, ("192.0.2.1", 32853)),
        (RFC5769_IPV6_RESPONSE, ("2001:db8:1234:5678:11:2233:4455:6677", 32853)),
    ],
)
def test_rfc5769_responses_carry_their_xor_mapped_address(
    raw: bytes, address: tuple[str, int]
) -> None:
    message = stun.parse(raw).message
    assert message.message_class == stun.Class.RESPONSE
    assert message.attributes["XOR-MAPPED-ADDRESS"] == address
    assert message.attributes["SOFTWARE"] == "test vector"
    assert message.check_message_integrity(RFC5769_PASSWORD)


def test_rfc5769_long_term_request_verifies_with_md5_of_user_realm_password() -> None:
    message = stun.parse(RFC5769_LONG_TERM_REQUEST).message
    user = message.attributes["USERNAME"]
    assert user == "\u30de\u30c8\u30ea\u30c3\u30af\u30b9"
    assert message.attributes["REALM"] == "example.org"
    assert message.attributes["NONCE"] == b"f//499k954d6OL34oL9FSTvy64sA"
    key = hashlib.md5(f"{user}:example.org:{RFC5769_LONG_TERM_PASSWORD}".encode()).digest()
    assert message.check_message_integrity(key)
    assert "FINGERPRINT" not in message.attributes  # §2.4 has none, and needs none


# -- round trips -----------------------------------------------------------------------------

EVERY_EXTRA: dict[str, Any] = {
    "UNKNOWN-ATTRIBUTES": (0x001A, 0x7FFF),
    "REQUESTED-ADDRESS-FAMILY": stun.FAMILY_IPV6,
    "EVEN-PORT": 0x80,
    "RESERVATION-TOKEN": b"12345678",
    "CONNECTION-ID": 0xDEADBEEF,
    "ADDITIONAL-ADDRESS-FAMILY": stun.FAMILY_IPV6,
    "ADDRESS-ERROR-CODE": (stun.FAMILY_IPV6, 440, "Address Family not Supported"),
}


@pytest.mark.parametrize("key", [None, KEY])
@pytest.mark.parametrize(
    "attributes",
    [
        {},
        {"REQUESTED-TRANSPORT": stun.TRANSPORT_UDP, "LIFETIME": 600},
        {"XOR-PEER-ADDRESS": ("192.0.2.7", 4242), "DATA": b"odd"},
        {"XOR-RELAYED-ADDRESS": ("2001:db8::7", 49152), "USERNAME": "u", "NONCE": b"n" * 5},
        EVERY_EXTRA,
    ],
)
def test_what_encode_builds_parses_back_with_integrity_and_fingerprint(
    attributes: dict[str, Any], key: bytes | None
) -> None:
    raw = stun.encode(stun.Method.ALLOCATE, stun.Class.REQUEST, TID, attributes, key=key)
    parsed = stun.parse(raw)
    got = parsed.message.attributes
    assert {name: got[name] for name in attributes} == attributes
    assert "FINGERPRINT" in got
    assert parsed.message.check_message_integrity(KEY) is (key is not None)
    assert parsed.unknown_required == ()
    assert bytes(parsed.message) == raw


def test_a_message_built_by_hand_is_sent_with_a_fingerprint() -> None:
    message = stun.Message(
        stun.Method.REFRESH,
        stun.Class.REQUEST,
        TID,
        {"LIFETIME": 0, "FINGERPRINT": 1, "MESSAGE-INTEGRITY": b"x" * 20},
    )
    parsed = stun.parse(bytes(message)).message
    assert parsed.attributes["LIFETIME"] == 0
    assert parsed.integrity_data is None  # a stale MESSAGE-INTEGRITY is not sent
    assert parsed.method_name == "REFRESH"


def test_encode_matches_aioice_byte_for_byte_on_what_aioice_knows() -> None:
    attributes = {"XOR-PEER-ADDRESS": ("2001:db8::1", 3478), "SOFTWARE": "stunnerd"}
    theirs = aioice_stun.Message(
        aioice_stun.Method.CREATE_PERMISSION, aioice_stun.Class.REQUEST, TID, dict(attributes)
    )
    theirs.add_message_integrity(KEY)
    ours = stun.encode(stun.Method.CREATE_PERMISSION, stun.Class.REQUEST, TID, attributes, key=KEY)
    assert ours == bytes(theirs)


def test_repeated_attributes_are_sent_in_order_and_every_peer_is_kept() -> None:
    peers = [("192.0.2.1", 1), ("2001:db8::2", 2), ("192.0.2.3", 3)]
    raw = stun.encode(
        stun.Method.CREATE_PERMISSION,
        stun.Class.REQUEST,
        TID,
        [("XOR-PEER-ADDRESS", peer) for peer in peers],
    )
    parsed = stun.parse(raw)
    assert parsed.peers == tuple(peers)
    assert parsed.message.attributes["XOR-PEER-ADDRESS"] == peers[-1]


@pytest.mark.parametrize(
    "address", [("192.0.2.1", 32853), ("2001:db8:1234:5678:11:2233:4455:6677", 0)]
)
def test_xor_addresses_pack_and_unpack_like_aioice(address: tuple[str, int]) -> None:
    packed = stun.pack_xor_address(address, TID)
    assert packed == aioice_stun.pack_xor_address(address, TID)
    assert stun.unpack_xor_address(packed, TID) == address


# -- integrity and fingerprint ---------------------------------------------------------------


def test_a_flipped_byte_breaks_the_fingerprint_of_a_request_and_of_a_response() -> None:
    for raw, is_request in ((RFC5769_REQUEST, True), (RFC5769_IPV4_RESPONSE, False)):
        tampered = bytearray(raw)
        tampered[30] ^= 1
        with pytest.raises(stun.StunFormatError, match="fingerprint") as caught:
            stun.parse(bytes(tampered))
        assert caught.value.is_request is is_request
        assert caught.value.transaction_id == TID


def test_a_flipped_byte_before_message_integrity_fails_only_the_integrity_check() -> None:
    raw = bytearray(RFC5769_LONG_TERM_REQUEST)  # no FINGERPRINT to catch it first
    raw[-30] ^= 1  # inside REALM
    message = stun.parse(bytes(raw)).message
    user = message.attributes["USERNAME"]
    key = hashlib.md5(f"{user}:example.org:{RFC5769_LONG_TERM_PASSWORD}".encode()).digest()
    assert not message.check_message_integrity(key)


def test_attributes_after_message_integrity_are_ignored_but_fingerprint() -> None:
    body = stun.encode(stun.Method.ALLOCATE, stun.Class.REQUEST, TID, {"LIFETIME": 1}, key=KEY)
    body = body[:-8]  # without its FINGERPRINT
    late = b"\x00\x0d\x00\x04\x00\x00\x00\x02" + b"\x00\x1c\x00\x04\x00\x00\x00\x00"
    raw = body[:2] + (len(body) - 20 + len(late)).to_bytes(2, "big") + body[4:] + late
    parsed = stun.parse(raw)
    assert parsed.message.attributes["LIFETIME"] == 1  # not the late 2
    assert parsed.unknown_required == ()  # 0x001C comes after MESSAGE-INTEGRITY


def test_a_message_without_message_integrity_fails_the_check() -> None:
    message = stun.parse(stun.encode(stun.Method.BINDING, stun.Class.REQUEST, TID, {})).message
    assert not message.check_message_integrity(KEY)


# -- methods, unknown attributes, malformed bytes --------------------------------------------


@pytest.mark.parametrize(
    ("method", "attributes"),
    [
        (stun.Method.CONNECT, {"XOR-PEER-ADDRESS": ("192.0.2.7", 4242)}),
        (stun.Method.CONNECTION_BIND, {"CONNECTION-ID": 77}),
        (stun.Method.CONNECTION_ATTEMPT, {"CONNECTION-ID": 78, "XOR-PEER-ADDRESS": ("::1", 9)}),
    ],
)
def test_rfc6062_methods_round_trip_although_aioice_refuses_them(
    method: stun.Method, attributes: dict[str, Any]
) -> None:
    raw = stun.encode(method, stun.Class.REQUEST, TID, attributes, key=KEY)
    assert int.from_bytes(raw[:2], "big") == method  # RFC 6062 §6.1: 0x000A-0x000C
    with pytest.raises(ValueError, match="not a valid Method"):
        aioice_stun.parse_message(raw)
    message = stun.parse(raw, known_methods_only=True).message
    assert message.message_method is method
    assert method in stun.TCP_METHODS
    assert {name: message.attributes[name] for name in attributes} == attributes
    assert message.check_message_integrity(KEY)


def test_an_unknown_method_is_kept_as_its_number_unless_only_known_ones_are_wanted() -> None:
    raw = stun.encode(0x00D, stun.Class.RESPONSE, TID, {"LIFETIME": 1})
    message = stun.parse(raw).message
    assert message.message_method == 0x00D
    assert message.method_name == "method 0xd"
    with pytest.raises(stun.StunFormatError, match="unknown method"):
        stun.parse(raw, known_methods_only=True)


def test_unknown_comprehension_required_attributes_are_listed_optional_ones_not() -> None:
    header = b"\x00\x01\x00\x10" + stun.MAGIC + TID
    raw = header + b"\x7f\xff\x00\x00" + b"\xc0\x01\x00\x00" + b"\x00\x1a\x00\x04abcd"
    assert stun.parse(raw).unknown_required == (0x7FFF, 0x001A)


def _spans(raw: bytes) -> list[tuple[int, int, int]]:
    spans, pos = [], stun.HEADER_LENGTH
    while pos < len(raw):
        attr_type, attr_len = stun.ATTR_HEADER.unpack_from(raw, pos)
        spans.append((attr_type, pos, pos + 4 + attr_len))
        pos += 4 + attr_len + -attr_len % 4
    return spans


@pytest.mark.parametrize(
    "raw",
    [
        RFC5769_REQUEST,
        RFC5769_IPV6_RESPONSE,
        RFC5769_LONG_TERM_REQUEST,
        stun.encode(0x00D, stun.Class.REQUEST, TID, {"LIFETIME": 1}),
        b"\x00\x03\x00\x08" + stun.MAGIC + TID + b"\x00\x18\x00\x02\x80\x00\x00\x00",
        b"\x00\x01\x00\x08" + stun.MAGIC + TID + b"\x00\x12\x00\x04\x00\x07\x00\x01",
    ],
)
def test_a_message_walked_already_parses_as_parse_does(raw: bytes) -> None:
    msg_type, tid = int.from_bytes(raw[:2], "big"), raw[8:20]
    for known_methods_only in (False, True):
        try:
            expected: Any = stun.parse(raw, known_methods_only=known_methods_only)
        except stun.StunFormatError as exc:
            expected = (str(exc), exc.method, exc.is_request, exc.transaction_id)
        try:
            walked: Any = stun.parse_walked(
                raw, msg_type, tid, _spans(raw), known_methods_only=known_methods_only
            )
        except stun.StunFormatError as exc:
            walked = (str(exc), exc.method, exc.is_request, exc.transaction_id)
        assert walked == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\x00\x01\x00\x08" + stun.MAGIC + TID + b"\x00\x0d\x00\x08abcd", "overruns"),
        (b"\x00\x01\x00\x08" + stun.MAGIC + TID + b"\x00\x12\x00\x04\x00\x07\x00\x01", "PEER"),
        (b"\x00\x03\x00\x08" + stun.MAGIC + TID + b"\x00\x18\x00\x02\x80\x00\x00\x00", "EVEN"),
    ],
)
def test_malformed_attributes_are_a_format_error_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(stun.StunFormatError, match=reason) as caught:
        stun.parse(raw)
    assert caught.value.is_request
    assert caught.value.method == raw[1]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        RFC5769_REQUEST[:19],
        RFC5769_REQUEST[:-4],  # length field says more
        b"\x40\x00\x00\x10" + RFC5769_REQUEST[4:20],  # ChannelData
        RFC5769_REQUEST[:4] + b"\x21\x12\xa4\x43" + RFC5769_REQUEST[8:],  # not the cookie
        RFC5769_REQUEST[:3] + b"\x5a" + RFC5769_REQUEST[4:],  # length not a multiple of 4
    ],
)
def test_bytes_that_are_not_one_stun_message_are_refused_before_any_attribute(raw: bytes) -> None:
    with pytest.raises(ValueError, match="STUN") as caught:
        stun.parse(raw)
    assert not isinstance(caught.value, stun.StunFormatError)


# -- frames on a stream ----------------------------------------------------------------------


@pytest.mark.parametrize("payload", [b"", b"a", b"abcd", b"abcde"])
def test_a_stream_frame_is_a_whole_stun_message_or_padded_channel_data(payload: bytes) -> None:
    message = stun.encode(stun.Method.SEND, stun.Class.INDICATION, TID, {"DATA": payload})
    assert stun.looks_like_stun(message)
    assert stream_frame_length(message[:4]) == len(message)
    frame = channel_data(0x4000, payload, stream=True)
    assert is_channel_data(frame)
    assert not stun.looks_like_stun(frame + bytes(20))
    assert stream_frame_length(frame[:4]) == len(frame) == 4 + len(payload) + (-len(payload) % 4)


def test_the_address_family_of_a_literal() -> None:
    assert stun.address_family("192.0.2.1") == stun.FAMILY_IPV4
    assert stun.address_family("2001:db8::1") == stun.FAMILY_IPV6
