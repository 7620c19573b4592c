"""The probe HTTP server stunnerd shares with the operator (``stunner_common.io.probe_http``)."""

from stunner_common.io.probe_http import (
    MAX_REQUEST_HEAD_BYTES,
    REQUEST_HEAD_TIMEOUT_S,
    Handler,
    HttpServer,
    Response,
)

__all__ = ["MAX_REQUEST_HEAD_BYTES", "REQUEST_HEAD_TIMEOUT_S", "Handler", "HttpServer", "Response"]
