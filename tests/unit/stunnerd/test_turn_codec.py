"""The server's codec: RFC 5769 vectors, 400 or drop, Send/Data indications, ChannelData framing."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
from aioice import stun

from stunnerd.turn import codec
from support.stun import RFC5769_IPV4_RESPONSE as IPV4_RESPONSE
from support.stun import RFC5769_IPV6_RESPONSE as IPV6_RESPONSE
from support.stun import RFC5769_LONG_TERM_REQUEST as LONG_TERM_REQUEST
from support.stun import RFC5769_PASSWORD as PASSWORD
from support.stun import RFC5769_REQUEST as REQUEST


def test_rfc5769_sample_request_parses_and_its_integrity_verifies() -> None:
    decoded = codec.decode(REQUEST)
    assert decoded.unknown_required == ()
    assert decoded.message.attributes["USERNAME"] == "evtj:h6vY"
    assert decoded.message.attributes["SOFTWARE"] == "STUN test client"
    assert codec.check_integrity(decoded.message, PASSWORD)
    assert not codec.check_integrity(decoded.message, b"wrong")


@pytest.mark.parametrize(
    ("raw", "address"),
    [
        (IPV4_RESPONSE, ("192.0.2.1", 32853)),
        (IPV6_RESPONSE, ("2001:db8:1234:5678:11:2233:4455:6677", 32853)),
    ],
)
def test_rfc5769_sample_responses_give_the_xor_mapped_address(
    raw: bytes, address: tuple[str, int]
) -> None:
    message = codec.decode(raw).message
    assert message.attributes["XOR-MAPPED-ADDRESS"] == address
    assert codec.check_integrity(message, PASSWORD)


def test_rfc5769_long_term_request_verifies_with_md5_of_user_realm_password() -> None:
    message = codec.decode(LONG_TERM_REQUEST).message
    assert message.attributes["REALM"] == "example.org"
    assert message.attributes["NONCE"] == b"f//499k954d6OL34oL9FSTvy64sA"
    user = message.attributes["USERNAME"]
    key = hashlib.md5(f"{user}:example.org:TheMatrIX".encode()).digest()
    assert codec.check_integrity(message, key)


def test_a_flipped_byte_breaks_the_fingerprint() -> None:
    tampered = bytearray(REQUEST)
    tampered[30] ^= 1
    with pytest.raises(codec.StunBadRequestError):
        codec.decode(bytes(tampered))


def test_unknown_required_attributes_after_message_integrity_are_ignored() -> None:
    body = REQUEST[:-8]  # drop FINGERPRINT, keep MESSAGE-INTEGRITY last
    extra = b"\x00\x1c\x00\x04\x00\x00\x00\x00"  # MESSAGE-INTEGRITY-SHA256 stand-in
    raw = body[:2] + (len(body) - 20 + len(extra)).to_bytes(2, "big") + body[4:] + extra
    assert codec.decode(raw).unknown_required == ()


def test_encode_adds_integrity_and_fingerprint_that_aioice_accepts() -> None:
    raw = codec.encode(
        codec.Method.ALLOCATE,
        codec.Class.RESPONSE,
        b"x" * 12,
        {"LIFETIME": 600},
        key=b"k" * 16,
        software="stunnerd",
    )
    message = codec.decode(raw).message
    assert message.attributes["LIFETIME"] == 600
    assert codec.check_integrity(message, b"k" * 16)


@pytest.mark.parametrize(
    ("payload", "stream", "expected"),
    [
        (b"abc", False, b"\x40\x00\x00\x03abc"),
        (b"abc", True, b"\x40\x00\x00\x03abc\x00"),
        (b"abcd", True, b"\x40\x00\x00\x04abcd"),
        (b"", True, b"\x40\x00\x00\x00"),
    ],
)
def test_channel_data_framing_pads_only_on_streams(
    payload: bytes, stream: bool, expected: bytes
) -> None:
    assert codec.channel_data(0x4000, payload, stream=stream) == expected
    assert codec.parse_channel_data(expected) == (0x4000, payload)


@pytest.mark.parametrize(
    ("buf", "size"),
    [
        (b"", 0),
        (b"\x40\x00", 0),
        (b"\x40\x00\x00\x03", 8),
        (b"\x40\x00\x00\x04", 8),
        (b"\x00\x01\x00\x08", 28),
        (b"\x80\x00\x00\x00", -1),
    ],
)
def test_stream_frame_length(buf: bytes, size: int) -> None:
    assert codec.stream_frame_length(buf) == size


@pytest.mark.parametrize(
    "address", [("192.0.2.1", 32853), ("2001:db8:1234:5678:11:2233:4455:6677", 32853)]
)
def test_our_xor_address_packing_matches_aioice(address: tuple[str, int]) -> None:
    from aioice import stun

    tid = bytes.fromhex("b7e7a701bc34d686fa87dfae")
    assert codec.pack_xor_address(address, tid) == stun.pack_xor_address(address, tid)


def send_indication(attrs: dict[str, object], *, fingerprint: bool = True) -> bytes:
    from aioice import stun

    msg = stun.Message(stun.Method.SEND, stun.Class.INDICATION, attributes=dict(attrs))
    if fingerprint:
        msg.add_fingerprint()
    return bytes(msg)


@pytest.mark.parametrize("fingerprint", [True, False])
@pytest.mark.parametrize("payload", [b"", b"a", b"abcd", b"x" * 1201])
def test_send_indications_parse_by_hand_like_the_full_decoder(
    fingerprint: bool, payload: bytes
) -> None:
    raw = send_indication(
        {"XOR-PEER-ADDRESS": ("10.20.30.40", 5004), "DATA": payload}, fingerprint=fingerprint
    )
    assert codec.parse_send_indication(raw) == (("10.20.30.40", 5004), payload)
    full = codec.decode(raw).message.attributes
    assert (full["XOR-PEER-ADDRESS"], full["DATA"]) == (("10.20.30.40", 5004), payload)


@pytest.mark.parametrize(
    "raw",
    [
        send_indication({"XOR-PEER-ADDRESS": ("2001:db8::1", 1), "DATA": b"x"}),
        send_indication({"DATA": b"x"}),
        send_indication({"XOR-PEER-ADDRESS": ("1.2.3.4", 1)}),
        send_indication({"XOR-PEER-ADDRESS": ("1.2.3.4", 1), "DATA": b"x"})[:-1],
        send_indication({"XOR-PEER-ADDRESS": ("1.2.3.4", 1), "DATA": b"x"})[:-4] + b"\0\0\0\0",
    ],
    # Named, not shown: each run draws new transaction IDs, and parallel workers must collect
    # the same test names.
    ids=["ipv6-peer", "no-peer", "no-data", "truncated", "bad-fingerprint"],
)
def test_unusual_send_indications_are_left_to_the_full_decoder(raw: bytes) -> None:
    assert codec.parse_send_indication(raw) is None


@pytest.mark.parametrize("peer", [("192.0.2.7", 3478), ("2001:db8::7", 3478)])
def test_data_indications_are_valid_stun_with_a_fingerprint(peer: tuple[str, int]) -> None:
    raw = codec.data_indication(peer, b"hello", b"t" * 12)
    message = codec.decode(raw).message  # aioice checks the fingerprint
    assert message.message_method == codec.Method.DATA
    assert message.message_class == codec.Class.INDICATION
    assert message.attributes["XOR-PEER-ADDRESS"] == peer
    assert message.attributes["DATA"] == b"hello"
    assert "FINGERPRINT" in message.attributes


def test_importing_the_codec_leaves_aioice_as_shipped() -> None:
    probe = (
        "from aioice import stun\n"
        "before = (len(stun.ATTRIBUTES), dict(stun.ATTRIBUTES_BY_TYPE))\n"
        "import stunnerd.turn.codec\n"
        "assert (len(stun.ATTRIBUTES), dict(stun.ATTRIBUTES_BY_TYPE)) == before\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_extra_turn_attributes_round_trip_without_aioice_knowing_them() -> None:
    assert 0x0018 not in stun.ATTRIBUTES_BY_TYPE  # aioice 0.13 lacks EVEN-PORT
    attrs = {
        "REQUESTED-TRANSPORT": codec.TRANSPORT_UDP,
        "EVEN-PORT": 0x80,
        "REQUESTED-ADDRESS-FAMILY": codec.FAMILY_IPV6,
        "RESERVATION-TOKEN": b"12345678",
        "UNKNOWN-ATTRIBUTES": (0x001A, 0x7FFF),
    }
    raw = codec.encode(codec.Method.ALLOCATE, codec.Class.REQUEST, b"t" * 12, attrs, key=b"k" * 16)
    decoded = codec.decode(raw)
    assert decoded.unknown_required == ()
    assert {name: decoded.message.attributes[name] for name in attrs} == attrs
    assert codec.check_integrity(decoded.message, b"k" * 16)


def test_a_malformed_extra_attribute_in_a_request_is_a_bad_request() -> None:
    even_port = b"\x00\x18\x00\x02\x80\x00\x00\x00"  # EVEN-PORT must be 1 byte, not 2
    raw = b"\x00\x03\x00\x08\x21\x12\xa4\x42" + b"t" * 12 + even_port
    with pytest.raises(codec.StunBadRequestError, match="EVEN-PORT"):
        codec.decode(raw)


@pytest.mark.usefixtures("aioice_turn_attributes")
def test_rfc_6062_requests_decode_with_their_attributes_integrity_and_fingerprint() -> None:
    """aioice's parser refuses methods it does not know; the codec reads Connect itself."""
    key = hashlib.md5(b"user:realm:pass").digest()
    msg = stun.Message(
        0x000A,  # type: ignore[arg-type]  # Connect (RFC 6062 §6.1)
        stun.Class.REQUEST,
        attributes={"XOR-PEER-ADDRESS": ("192.0.2.7", 4242), "CONNECTION-ID": 77},
    )
    msg.add_message_integrity(key)
    raw = bytes(msg)
    decoded = codec.decode(raw)
    assert int(decoded.message.message_method) == codec.TcpMethod.CONNECT
    assert decoded.message.message_class == stun.Class.REQUEST
    assert decoded.message.attributes["XOR-PEER-ADDRESS"] == ("192.0.2.7", 4242)
    assert decoded.message.attributes["CONNECTION-ID"] == 77
    assert decoded.peers == (("192.0.2.7", 4242),)
    assert codec.check_integrity(decoded.message, key)
    tampered = bytearray(raw)
    tampered[26] ^= 1
    with pytest.raises(codec.StunBadRequestError):
        codec.decode(bytes(tampered))
