"""aioice as an independent TURN peer in tests.

aioice 0.13 cannot build or parse EVEN-PORT, RESERVATION-TOKEN, REQUESTED-ADDRESS-FAMILY and
UNKNOWN-ATTRIBUTES. Our codec (`stunner_common.stun`) handles them with its own tables and leaves
aioice alone; a test whose aioice client speaks them asks for `aioice_knows_turn_attributes`,
which teaches aioice's tables those attributes for that test only and restores them afterwards.
aioice's parser also refuses the RFC 6062 methods (Connect, ConnectionBind, ConnectionAttempt):
`parse` reads any method with aioice's attribute table plus CONNECTION-ID.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aioice import stun

from stunner_common.stun import EXTRA_ATTRIBUTES

CONNECT, CONNECTION_BIND, CONNECTION_ATTEMPT = 0x000A, 0x000B, 0x000C  # RFC 6062 §6.1

# RFC 5769 §2.1-2.4, byte for byte: the STUN test vectors.
RFC5769_PASSWORD = b"VOkJxbRl1RmTxUk/WvJxBt"  # §2.1-2.3: the short-term key
RFC5769_REQUEST = bytes.fromhex(
    "000100582112a442b7e7a701bc34d686fa87dfae802200105354554e207465737420636c69656e74"
    "002400046e0001ff80290008932ff9b151263b36000600096576746a3a68367659202020"
    "000800149aeaa70cbfd8cb56781ef2b5b2d3f249c1b571a280280004e57a3bcf"
)
RFC5769_IPV4_RESPONSE = bytes.fromhex(
    "0101003c2112a442b7e7a701bc34d686fa87dfae8022000b7465737420766563746f7220"
    "002000080001a147e112a643000800142b91f599fd9e90c38c7489f92af9ba53f06be7d7"
    "80280004c07d4c96"
)
RFC5769_IPV6_RESPONSE = bytes.fromhex(
    "010100482112a442b7e7a701bc34d686fa87dfae8022000b7465737420766563746f7220"
    "002000140002a1470113a9faa5d3f179bc25f4b5bed2b9d900080014a382954e4be67bf1"
    "1784c97c8292c275bfe3ed4180280004c8fb0b4c"
)
RFC5769_LONG_TERM_REQUEST = bytes.fromhex(  # §2.4: USERNAME in Unicode, realm example.org
    "000100602112a44278ad3433c6ad72c029da412e00060012e3839ee38388e383aae38383"
    "e382afe382b900000015001c662f2f3439396b39353464364f4c33346f4c394653547679"
    "363473410014000b6578616d706c652e6f72670000080014f67024656dd64a3e02b8e071"
    "2e85c9a28ca89666"
)
RFC5769_LONG_TERM_PASSWORD = "TheMatrIX"


@contextlib.contextmanager
def aioice_knows_turn_attributes() -> Iterator[None]:
    saved = (list(stun.ATTRIBUTES), dict(stun.ATTRIBUTES_BY_TYPE), dict(stun.ATTRIBUTES_BY_NAME))
    try:
        for entry in EXTRA_ATTRIBUTES:
            if entry[0] not in stun.ATTRIBUTES_BY_TYPE:
                stun.ATTRIBUTES.append(entry)
                stun.ATTRIBUTES_BY_TYPE[entry[0]] = entry
                stun.ATTRIBUTES_BY_NAME[entry[1]] = entry
        yield
    finally:
        stun.ATTRIBUTES[:] = saved[0]
        stun.ATTRIBUTES_BY_TYPE.clear()
        stun.ATTRIBUTES_BY_TYPE.update(saved[1])
        stun.ATTRIBUTES_BY_NAME.clear()
        stun.ATTRIBUTES_BY_NAME.update(saved[2])


@dataclass
class Reply:
    """A STUN message from the server, parsed enough for these tests."""

    method: int
    klass: int
    transaction_id: bytes
    attributes: dict[str, Any]

    @property
    def error_code(self) -> int | None:
        error = self.attributes.get("ERROR-CODE")
        return None if error is None else int(error[0])


def parse(data: bytes) -> Reply:
    """Any STUN message, any method; unknown attributes are skipped."""
    msg_type, _length, _cookie, tid = struct.unpack("!HHI12s", data[:20])
    attrs: dict[str, Any] = {}
    pos = 20
    while pos + 4 <= len(data):
        attr_type, attr_len = struct.unpack("!HH", data[pos : pos + 4])
        value = data[pos + 4 : pos + 4 + attr_len]
        if attr_type == 0x002A:
            attrs["CONNECTION-ID"] = int.from_bytes(value, "big")
        elif attr_type in stun.ATTRIBUTES_BY_TYPE:
            _, name, _, unpack = stun.ATTRIBUTES_BY_TYPE[attr_type]
            if unpack is stun.unpack_xor_address:
                attrs[name] = unpack(value, transaction_id=tid)
            else:
                attrs[name] = unpack(value)
        pos += 4 + attr_len + (-attr_len % 4)
    return Reply(msg_type & 0x3EEF, msg_type & 0x0110, tid, attrs)
