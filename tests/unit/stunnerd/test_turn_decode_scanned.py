"""A request decoded from its precheck scan answers exactly what a full decode answers."""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stunnerd.turn import codec, precheck
from stunnerd.turn.codec import StunBadRequestError, StunDecodeError

KEY = hashlib.md5(b"user:realm:pass").digest()
TID = bytes(range(12))
ALLOCATE = 0x0003
Attr = tuple[int, bytes]

TRANSPORT: Attr = (0x0019, b"\x11\x00\x00\x00")
USERNAME: Attr = (0x0006, b"user")
REALM: Attr = (0x0014, b"realm")
NONCE: Attr = (0x0015, b"n" * 24)
CREDENTIALS = [TRANSPORT, USERNAME, REALM, NONCE]
PEER_V4: Attr = (0x0012, struct.pack("!BBHI", 0, 1, 0x1234, 0x5E12A443))
PEER_V6: Attr = (0x0012, struct.pack("!BBH", 0, 2, 0x1234) + bytes(range(16)))


def message(attrs: list[Attr], msg_type: int = ALLOCATE) -> bytes:
    body = b"".join(struct.pack("!HH", t, len(v)) + v + bytes(-len(v) % 4) for t, v in attrs)
    return struct.pack("!HHI", msg_type, len(body), 0x2112A442) + TID + body


def signed(attrs: list[Attr], *, fingerprint: bool = True, msg_type: int = ALLOCATE) -> bytes:
    """`attrs`, MESSAGE-INTEGRITY under KEY and (with `fingerprint`) FINGERPRINT."""
    body = message(attrs, msg_type)[20:]
    head = struct.pack("!HHI", msg_type, len(body) + 24, 0x2112A442) + TID
    data = head + body + b"\x00\x08\x00\x14" + hmac.digest(KEY, head + body, "sha1")
    if not fingerprint:
        return data
    data = data[:2] + struct.pack("!H", len(data) - 20 + 8) + data[4:]
    crc = zlib.crc32(data) ^ 0x5354554E
    return data + b"\x80\x28\x00\x04" + struct.pack("!I", crc)


def outcome(decode: Any) -> Any:
    """What a decode answers: the parsed message, or the error (type, reason, method, tid)."""
    try:
        decoded = decode()
    except StunBadRequestError as exc:
        return (StunBadRequestError, str(exc), exc.method, exc.transaction_id)
    except StunDecodeError as exc:
        return (StunDecodeError, str(exc))
    return decoded


def both(data: bytes) -> tuple[Any, Any]:
    """A decode from scratch and one from the scan of `data` (which must pass the scan)."""
    head = precheck.header(data, 4096)
    found = precheck.scan(data, head)
    scanned = outcome(
        lambda: codec.decode_scanned(data, head.msg_type, head.transaction_id, found.spans)
    )
    return outcome(lambda: codec.decode(data)), scanned


def test_scan_keeps_where_each_attribute_lies() -> None:
    data = signed([TRANSPORT, USERNAME])
    found = precheck.scan(data, precheck.header(data, 4096))
    assert found.spans == [
        (0x0019, 20, 28),
        (0x0006, 28, 36),
        (0x0008, 36, 60),
        (0x8028, 60, 68),
    ]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(signed(CREDENTIALS), id="integrity-then-fingerprint"),
        pytest.param(signed(CREDENTIALS, fingerprint=False), id="integrity-last"),
        pytest.param(signed([*CREDENTIALS, (0x0006, b"other")]), id="duplicated-username"),
        pytest.param(signed([*CREDENTIALS, PEER_V6]), id="ipv6-peer"),
        pytest.param(signed([PEER_V4, *CREDENTIALS, PEER_V6, PEER_V4]), id="several-peers"),
        pytest.param(
            signed([*CREDENTIALS, (0x7FFE, b"x"), (0xC001, b"y"), (0x0030, b"")]),
            id="unknown-required-and-optional",
        ),
        pytest.param(signed([*CREDENTIALS, (0x0012, b"\x00\x03\x00\x00")]), id="bad-peer"),
        pytest.param(signed([(0x0019, b"\x11"), *CREDENTIALS[1:]]), id="malformed-transport"),
        pytest.param(
            signed([(0x0019, b"\x11"), *CREDENTIALS[1:], (0x0012, b"\x00\x03")]),
            id="malformed-then-bad-peer",
        ),
        pytest.param(signed([*CREDENTIALS, (0x8028, b"crc!")]), id="fingerprint-before-integrity"),
        pytest.param(signed(CREDENTIALS, msg_type=0x00FF), id="unknown-method"),
        pytest.param(
            signed([(0x0019, b"\x11"), *CREDENTIALS[1:]], msg_type=0x00FF),
            id="unknown-method-and-malformed",
        ),
        pytest.param(message([(0x0019, b"\x11"), PEER_V6], msg_type=0x0103), id="response"),
        pytest.param(message([]), id="no-attributes"),
    ],
)
def test_a_decode_from_the_scan_answers_what_a_decode_from_scratch_does(data: bytes) -> None:
    scratch, scanned = both(data)
    assert scanned == scratch


def test_a_bad_fingerprint_after_integrity_is_the_same_400_either_way() -> None:
    data = signed(CREDENTIALS)
    data = data[:-1] + bytes([data[-1] ^ 1])
    scratch, scanned = both(data)
    assert scanned == scratch
    assert scanned[0] is StunBadRequestError
    assert "fingerprint does not match" in scanned[1]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (signed(CREDENTIALS, fingerprint=False) + b"\x00\x06\x00\x00", "only FINGERPRINT"),
        (message([(0x0006, b"user"), (0x0014, b"")])[:-4] + b"\x00\x14\x00\x08", "overruns"),
    ],
)
def test_what_a_decode_from_scratch_would_skip_or_drop_never_passes_the_scan(
    data: bytes, reason: str
) -> None:
    data = data[:2] + struct.pack("!H", len(data) - 20) + data[4:]
    with pytest.raises(StunBadRequestError, match=reason):
        precheck.scan(data, precheck.header(data, 4096))


ATTRIBUTES = st.sampled_from(
    [
        TRANSPORT,
        USERNAME,
        (0x0006, b"other"),
        REALM,
        NONCE,
        PEER_V4,
        PEER_V6,
        (0x0012, b"\x00\x03\x00\x00"),
        (0x0019, b"\x11"),
        (0x000D, b"\x00\x00\x02\x58"),  # LIFETIME
        (0x000D, b"\x00"),
        (0x0017, b"\x02\x00\x00\x00"),  # REQUESTED-ADDRESS-FAMILY
        (0x0018, b"\x80"),  # EVEN-PORT
        (0x0022, b"t" * 8),  # RESERVATION-TOKEN
        (0x8022, b"soft"),  # SOFTWARE
        (0x8022, b"\xff"),
        (0x8028, b"crc!"),
        (0x0008, b"i" * 20),
        (0x7FFE, b"x"),
        (0xC001, b"y"),
        (0x8000, b"\x01\x00\x00\x00"),
        (0x8032, b"\x01"),
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    attrs=st.lists(ATTRIBUTES, max_size=12),
    how=st.sampled_from(["plain", "integrity", "fingerprint"]),
    msg_type=st.sampled_from([ALLOCATE, 0x0004, 0x0009, 0x00FF, 0x0103, 0x0113]),
)
def test_any_request_the_scan_passes_decodes_alike_from_the_scan(
    attrs: list[Attr], how: str, msg_type: int
) -> None:
    if how == "plain":
        data = message(attrs, msg_type)
    else:
        data = signed(attrs, fingerprint=how == "fingerprint", msg_type=msg_type)
    try:
        scratch, scanned = both(data)
    except (StunBadRequestError, StunDecodeError):
        return  # refused by the scan: never decoded
    assert scanned == scratch
