"""aioice as an independent TURN peer in tests.

aioice 0.13 cannot build or parse EVEN-PORT, RESERVATION-TOKEN, REQUESTED-ADDRESS-FAMILY and
UNKNOWN-ATTRIBUTES. stunnerd's codec handles them with its own tables and leaves aioice alone;
a test whose aioice client speaks them asks for `aioice_knows_turn_attributes`, which teaches
aioice's tables those attributes for that test only and restores them afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from aioice import stun

from stunnerd.turn.codec import EXTRA_ATTRIBUTES


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
