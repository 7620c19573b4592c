"""Running the app under uvicorn with the CDS's keepalive, TLS and shutdown settings."""

from __future__ import annotations

import logging

import uvicorn

from stunner_cds.app import create_app
from stunner_cds.settings import CdsSettings
from stunner_common.io.http import protocol_class, uvicorn_server

log = logging.getLogger(__name__)


class _DenialLogFilter(logging.Filter):
    """Drop uvicorn's error line after a WebSocket denial response.

    uvicorn's websockets-sansio protocol sends the denial correctly but then reports the ASGI
    app as having "returned without completing handshake"; every refused watch would log it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "returned without completing handshake" not in record.getMessage()


_DENIAL_FILTER = _DenialLogFilter()


def build_server(
    settings: CdsSettings, *, log_config: dict[str, object] | None = None
) -> uvicorn.Server:
    """A uvicorn server for the CDS; ``port=0`` picks a free port (read it after startup)."""
    app = create_app(settings)

    def refused(limit: str) -> None:
        ctx = getattr(app.state, "cds", None)  # set by the lifespan, before the first request
        if ctx is not None:
            ctx.metrics.refusals.labels(limit=limit).inc()

    server = uvicorn_server(
        app,
        settings,
        http=protocol_class(
            settings.request_limits(settings.max_http_connections_per_client),
            on_refusal=refused,
            logger=log,
        ),
        ws="websockets-sansio",
        ws_ping_interval=settings.ping_interval_s,
        ws_ping_timeout=settings.ping_timeout_s,
        ws_max_size=settings.ws_max_message_bytes,
        ws_per_message_deflate=False,
        ssl_certfile=settings.tls_cert_file,
        ssl_keyfile=settings.tls_key_file,
        log_config=log_config,
        backlog=4096,
    )
    error_log = logging.getLogger("uvicorn.error")
    if _DENIAL_FILTER not in error_log.filters:
        error_log.addFilter(_DENIAL_FILTER)
    return server


def bound_port(server: uvicorn.Server) -> int:
    """The port a started server listens on."""
    for srv in server.servers:
        for sock in srv.sockets:
            return int(sock.getsockname()[1])
    raise RuntimeError("server is not listening")
