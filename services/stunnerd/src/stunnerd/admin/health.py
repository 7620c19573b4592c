"""Liveness, readiness and the status document, as upstream's health-check server serves them.

Readiness tells whether this stunnerd serves anything: ready while at least one listener of the
config in force is serving, not ready before the first config, while every listener is left out
(a Gateway with no listener included), and for good once draining starts (unless
`--force-ready-status`). A config rejected whole changes nothing: the one in force keeps serving.
`/status` fills `allocationCount` and `status`, which upstream left empty, and never carries
credentials or TLS keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from stunnerd.admin.http import Response
from stunnerd.status import Lifecycle

READY_BODY = b'{"status":200,"message":"READY"}'
NOT_READY_BODY = b'{"status":503,"message":"stunnerd not ready"}'


def health_handler(
    lifecycle: Lifecycle, status: Callable[[], dict[str, Any]]
) -> Callable[[str], Response]:
    def handle(path: str) -> Response:
        if path == "/live":
            return Response(200, b"{}\n")
        if path == "/ready":
            if lifecycle.serving_ready:
                return Response(200, READY_BODY)
            return Response(503, NOT_READY_BODY)
        if path == "/status":
            return Response(200, json.dumps(status(), sort_keys=True).encode())
        return Response(404, b'{"status":404,"message":"not found"}')

    return handle
