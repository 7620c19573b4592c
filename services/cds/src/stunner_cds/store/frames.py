"""A server's WebSocket text frame on the wire (RFC 6455 section 5.2), built once per change.

A server sends its frames unmasked, so every watcher of a change gets the same bytes: the hub
encodes the frame once and writes it to each watcher's connection as it is
(``stunner_cds.store.hub.Sink``). One frame per message (FIN set, no fragments) and no extension
(the CDS turns permessage-deflate off), which is what a direct write may assume.
"""

from __future__ import annotations

import struct

FIN_TEXT = 0x81
"""FIN with opcode 1 (text)."""


def text_frame(payload: bytes) -> bytes:
    """The whole frame of one unfragmented, unmasked text message carrying ``payload``."""
    size = len(payload)
    if size < 126:
        header = bytes((FIN_TEXT, size))
    elif size < 1 << 16:
        header = struct.pack("!BBH", FIN_TEXT, 126, size)
    else:
        header = struct.pack("!BBQ", FIN_TEXT, 127, size)
    return header + payload
