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
