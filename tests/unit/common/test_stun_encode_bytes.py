"""`stunner_common.stun.encode` byte for byte: every answer a TURN server sends, against aioice's
serialisation where aioice knows the attributes, and against the plain one-attribute-at-a-time
encoder (aioice's packers, then MESSAGE-INTEGRITY and FINGERPRINT) everywhere. The encoder keeps
the packed form of values that repeat (SOFTWARE, REALM, ERROR-CODE, IPv4 addresses): these
tests change each of them between calls, so a cache that kept a stale form would show."""

from __future__ import annotations

import binascii
import hashlib
import hmac
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from aioice import stun as aioice_stun

from stunner_common import stun
from support.stun import aioice_knows_turn_attributes

KEY = hashlib.md5(b"user1:stunner.l7mp.io:pass1").digest()
TIDS = (bytes.fromhex("b7e7a701bc34d686fa87dfae"), bytes(range(1, 13)))
ALLOCATE, REFRESH, DATA = stun.Method.ALLOCATE, stun.Method.REFRESH, stun.Method.DATA
ERROR, RESPONSE, INDICATION = stun.Class.ERROR, stun.Class.RESPONSE, stun.Class.INDICATION

Attributes = Mapping[str, Any] | Sequence[tuple[str, Any]]


def plain_encode(
    method: int,
    klass: stun.Class,
    tid: bytes,
    attributes: Attributes,
    *,
    key: bytes | None = None,
    software: str | None = None,
) -> bytes:
    """Each attribute packed by its table entry, padded, then MESSAGE-INTEGRITY over the header
    and body (its length covering it), then FINGERPRINT (RFC 8489 §14.5, §14.7)."""
    items = list(attributes.items()) if isinstance(attributes, Mapping) else list(attributes)
    if software:
        items.append(("SOFTWARE", software))
    body = b""
    for name, value in items:
        attr_type, _, pack_value, _ = stun.ATTRIBUTES_BY_NAME[name]
        if pack_value is aioice_stun.pack_xor_address:
            packed = aioice_stun.pack_xor_address(value, tid)
        else:
            packed = pack_value(value)
        body += struct.pack("!HH", attr_type, len(packed)) + packed + bytes(-len(packed) % 4)
    msg_type = method | klass
    if key is not None:
        header = struct.pack("!HHI12s", msg_type, len(body) + 24, stun.COOKIE, tid)
        body += struct.pack("!HH", 0x0008, 20) + hmac.new(key, header + body, "sha1").digest()
    header = struct.pack("!HHI12s", msg_type, len(body) + 8, stun.COOKIE, tid)
    crc = binascii.crc32(header + body) ^ 0x5354554E
    return header + body + struct.pack("!HHI", 0x8028, 4, crc)


def aioice_encode(
    method: int,
    klass: stun.Class,
    tid: bytes,
    attributes: Mapping[str, Any],
    *,
    key: bytes | None = None,
    software: str | None = None,
) -> bytes:
    attrs = dict(attributes)
    if software:
        attrs["SOFTWARE"] = software
    with aioice_knows_turn_attributes():
        message = aioice_stun.Message(
            aioice_stun.Method(method), aioice_stun.Class(klass), tid, attrs
        )
        if key is not None:
            message.add_message_integrity(key)
        message.add_fingerprint()
        return bytes(message)


def challenge(realm: str, nonce: bytes, code: int = 401, reason: str = "Unauthorized") -> Any:
    return {"ERROR-CODE": (code, reason), "REALM": realm, "NONCE": nonce}


def allocated(relay: tuple[str, int], client: tuple[str, int], lifetime: int = 600) -> Any:
    return [("XOR-RELAYED-ADDRESS", relay), ("LIFETIME", lifetime), ("XOR-MAPPED-ADDRESS", client)]


# Every case twice in a row with a different transaction id; the cases follow one another so
# that each differs from the last in what a cache could keep.
AIOICE_CASES: list[tuple[str, int, stun.Class, Mapping[str, Any], bytes | None, str | None]] = [
    ("401", ALLOCATE, ERROR, challenge("stunner.l7mp.io", b"n" * 24), None, "stunnerd"),
    ("401, other nonce", ALLOCATE, ERROR, challenge("stunner.l7mp.io", b"m" * 23), None, "sw"),
    ("401, realm changed", ALLOCATE, ERROR, challenge("example.org", b"n" * 24), None, "stunnerd"),
    ("401, odd realm", ALLOCATE, ERROR, challenge("r", b"n" * 24), None, "stunnerd"),
    ("401, realm of 5", ALLOCATE, ERROR, challenge("realm", b"n" * 24), None, "stunnerd"),
    ("401, realm utf-8", ALLOCATE, ERROR, challenge("réalm", b"n" * 24), None, "stunnerd"),
    ("401, other software", ALLOCATE, ERROR, challenge("r", b"n" * 24), None, "other/1.0"),
    ("401, no software", ALLOCATE, ERROR, challenge("r", b"n" * 24), None, None),
    ("401, empty software", ALLOCATE, ERROR, challenge("r", b"n" * 24), None, ""),
    ("438", REFRESH, ERROR, challenge("r", b"n" * 24, 438, "Stale Nonce"), None, "stunnerd"),
    ("403 signed", ALLOCATE, ERROR, {"ERROR-CODE": (403, "Forbidden")}, KEY, "stunnerd"),
    ("403 other key", ALLOCATE, ERROR, {"ERROR-CODE": (403, "Forbidden")}, b"k" * 16, "stunnerd"),
    ("error, reason of 3", ALLOCATE, ERROR, {"ERROR-CODE": (400, "Bad")}, None, "stunnerd"),
    ("error, empty reason", ALLOCATE, ERROR, {"ERROR-CODE": (500, "")}, None, "stunnerd"),
    ("success v4", ALLOCATE, RESPONSE, dict(allocated(("10.0.0.1", 30000), ("192.0.2.7", 4000))),
     KEY, "stunnerd"),
    ("success, other ports", ALLOCATE, RESPONSE,
     dict(allocated(("10.0.0.1", 30002), ("192.0.2.7", 4002), 3600)), KEY, "stunnerd"),
    ("success, other ips", ALLOCATE, RESPONSE,
     dict(allocated(("10.0.0.2", 30002), ("192.0.2.8", 4002))), KEY, "stunnerd"),
    ("success v6", ALLOCATE, RESPONSE,
     dict(allocated(("2001:db8::1", 30000), ("2001:db8:1234:5678:11:2233:4455:6677", 0))),
     KEY, "stunnerd"),
    ("success, unsigned", ALLOCATE, RESPONSE,
     dict(allocated(("10.0.0.1", 30000), ("192.0.2.7", 4000))), None, "stunnerd"),
    ("refresh", REFRESH, RESPONSE, {"LIFETIME": 0}, KEY, None),
    ("data", DATA, INDICATION, {"XOR-PEER-ADDRESS": ("192.0.2.9", 9), "DATA": b"abcde"}, None,
     None),
    ("data v6", DATA, INDICATION, {"XOR-PEER-ADDRESS": ("2001:db8::9", 9), "DATA": b""}, None,
     "s"),
]  # fmt: skip


@pytest.mark.parametrize("tid", TIDS)
def test_answers_match_aioice_byte_for_byte(tid: bytes) -> None:
    for name, method, klass, attributes, key, software in AIOICE_CASES:
        ours = stun.encode(method, klass, tid, attributes, key=key, software=software)
        assert ours == aioice_encode(method, klass, tid, attributes, key=key, software=software), (
            name
        )
        assert ours == plain_encode(method, klass, tid, attributes, key=key, software=software), (
            name
        )
        as_pairs = list(attributes.items())
        assert stun.encode(method, klass, tid, as_pairs, key=key, software=software) == ours


PLAIN_CASES: list[tuple[str, int, stun.Class, Attributes, bytes | None, str | None]] = [
    ("dual allocation", ALLOCATE, RESPONSE,
     [("XOR-RELAYED-ADDRESS", ("10.0.0.1", 30000)), ("XOR-RELAYED-ADDRESS", ("2001:db8::1", 30001)),
      ("LIFETIME", 600), ("XOR-MAPPED-ADDRESS", ("192.0.2.7", 4000))], KEY, "stunnerd"),
    ("dual, family refused", ALLOCATE, RESPONSE,
     [("XOR-RELAYED-ADDRESS", ("10.0.0.1", 30000)),
      ("ADDRESS-ERROR-CODE", (stun.FAMILY_IPV6, 440, "Address Family not Supported")),
      ("LIFETIME", 600), ("XOR-MAPPED-ADDRESS", ("192.0.2.7", 4000))], KEY, "stunnerd"),
    ("reservation", ALLOCATE, RESPONSE,
     [*allocated(("10.0.0.1", 30000), ("192.0.2.7", 4000)), ("RESERVATION-TOKEN", b"t" * 8)],
     KEY, "stunnerd"),
    ("420", ALLOCATE, ERROR,
     {"ERROR-CODE": (420, "Unknown Attribute"), "UNKNOWN-ATTRIBUTES": (0x0031, 0x0032, 0x0033)},
     None, "stunnerd"),
    ("420, one", ALLOCATE, ERROR,
     {"ERROR-CODE": (420, "Unknown Attribute"), "UNKNOWN-ATTRIBUTES": (0x0031,)}, KEY, "stunnerd"),
    ("440 signed", ALLOCATE, ERROR,
     {"ERROR-CODE": (440, "Address Family not Supported"),
      "ADDRESS-ERROR-CODE": (stun.FAMILY_IPV4, 440, "Address Family not Supported")},
     KEY, "stunnerd"),
    ("connection attempt", stun.Method.CONNECTION_ATTEMPT, INDICATION,
     {"XOR-PEER-ADDRESS": ("192.0.2.9", 9), "CONNECTION-ID": 7}, None, "stunnerd"),
    ("connect", stun.Method.CONNECT, RESPONSE, {"CONNECTION-ID": 0xFFFFFFFF}, KEY, "stunnerd"),
    ("even port", ALLOCATE, stun.Class.REQUEST,
     {"REQUESTED-TRANSPORT": stun.TRANSPORT_UDP, "EVEN-PORT": 0x80,
      "REQUESTED-ADDRESS-FAMILY": stun.FAMILY_IPV6, "ADDITIONAL-ADDRESS-FAMILY": stun.FAMILY_IPV6},
     None, None),
    ("request", ALLOCATE, stun.Class.REQUEST,
     {"REQUESTED-TRANSPORT": stun.TRANSPORT_UDP, "USERNAME": "user1", "REALM": "stunner.l7mp.io",
      "NONCE": b"n" * 23}, KEY, None),
    ("request, other user", ALLOCATE, stun.Class.REQUEST,
     {"REQUESTED-TRANSPORT": stun.TRANSPORT_UDP, "USERNAME": "üser", "REALM": "stunner.l7mp.io",
      "NONCE": b"n" * 22}, KEY, None),
    ("channel bind", stun.Method.CHANNEL_BIND, stun.Class.REQUEST,
     {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": ("192.0.2.9", 65535)}, KEY, None),
    ("empty", stun.Method.BINDING, RESPONSE, {}, None, None),
    ("empty signed", stun.Method.BINDING, RESPONSE, {}, KEY, "stunnerd"),
]  # fmt: skip


@pytest.mark.parametrize("tid", TIDS)
def test_what_aioice_cannot_say_matches_the_plain_encoder(tid: bytes) -> None:
    for name, method, klass, attributes, key, software in PLAIN_CASES + AIOICE_CASES:
        ours = stun.encode(method, klass, tid, attributes, key=key, software=software)
        assert ours == plain_encode(method, klass, tid, attributes, key=key, software=software), (
            name
        )
        parsed = stun.parse(ours)
        assert parsed.message.check_message_integrity(key or b"") is (key is not None), name


def test_a_long_run_of_different_values_keeps_matching() -> None:
    """More distinct values than any cache of the encoder holds, each one twice."""
    for i in range(5000):
        for repeat in range(2):
            tid = i.to_bytes(4, "big") * 3
            realm = f"realm-{i % 6000}"
            software = f"sw{i % 7}" if repeat else "stunnerd"
            attributes = [
                ("ERROR-CODE", (400 + i % 100, f"reason {i}")),
                ("REALM", realm),
                ("XOR-MAPPED-ADDRESS", (f"10.{i // 250 % 250}.{i % 250}.{repeat}", i % 65536)),
            ]
            assert stun.encode(ALLOCATE, ERROR, tid, attributes, software=software) == (
                plain_encode(ALLOCATE, ERROR, tid, attributes, software=software)
            )


@pytest.mark.parametrize(
    ("attributes", "error"),
    [
        ({"NO-SUCH-ATTRIBUTE": 1}, KeyError),
        ({"LIFETIME": -1}, struct.error),
        ({"LIFETIME": 1 << 32}, struct.error),
        ({"XOR-MAPPED-ADDRESS": ("192.0.2.1", 65536)}, struct.error),
        ({"XOR-MAPPED-ADDRESS": ("not an ip", 1)}, ValueError),
        ({"REALM": b"bytes"}, AttributeError),
    ],
)
def test_values_that_do_not_pack_fail_as_before(attributes: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        plain_encode(ALLOCATE, RESPONSE, TIDS[0], attributes)
    with pytest.raises(error):
        stun.encode(ALLOCATE, RESPONSE, TIDS[0], attributes)
