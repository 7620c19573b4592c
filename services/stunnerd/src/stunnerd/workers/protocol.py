"""The supervisor ↔ worker wire: one JSON object per line over the worker's stdin and stdout.

Requests carry an `id` that the reply repeats. Configs travel as canonical JSON with `$VAR`
already expanded by the supervisor, so every worker runs byte-identical configs.
"""

from __future__ import annotations

import json
from typing import Any

MAX_LINE_BYTES = 64 * 1024 * 1024


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("worker message is not an object")
    return message
