"""A server's WebSocket text frame on the wire (RFC 6455 section 5.2), built once per change.

A server sends its frames unmasked, so every watcher of a change gets the same bytes: the hub
encodes the frame once and writes it to each watcher's connection as it is
(``stunner_cds.store.hub.Sink``). One frame per message (FIN set, no fragments) and no extension
(the CDS turns permessage-deflate off), which is what a direct write may assume.
"""

from __future__ import annotations

from stunner_common.wsframe import TEXT, encode_frame


def text_frame(payload: bytes) -> bytes:
    """The whole frame of one unfragmented, unmasked text message carrying ``payload``."""
    return encode_frame(TEXT, payload)
