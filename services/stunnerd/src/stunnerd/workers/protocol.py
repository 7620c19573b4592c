"""The supervisor ↔ worker line framing: one message per line over the worker's stdin and stdout.

The messages themselves, their `id` (which a reply repeats) and their codec are the contract
`stunner_common.contracts.worker_messages`. Configs travel as canonical JSON with `$VAR`
already expanded by the supervisor, so every worker runs byte-identical configs.
"""

from __future__ import annotations

from stunner_common.contracts.worker_messages import Reply, Request
from stunner_common.contracts.worker_messages import encode as encode_message

MAX_LINE_BYTES = 64 * 1024 * 1024


def encode(message: Request | Reply) -> bytes:
    return encode_message(message) + b"\n"
