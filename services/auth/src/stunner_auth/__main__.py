"""``stunner-auth``: run the authentication service (flags override ``AUTH_*``/``CDS_*``)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from stunner_auth.app import ERRORS, create_app
from stunner_auth.metrics import AuthMetrics
from stunner_auth.settings import AuthSettings
from stunner_common.cli import (
    CDS_ADDR_ENV,
    DEFAULT_CDS_ADDRESS,
    add_version_argument,
    check_token_file,
)
from stunner_common.io.http import protocol_class, serve, uvicorn_server
from stunner_common.process_settings import settings_from_args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="stunner-auth",
        description="STUNner authentication service: TURN credentials and ICE configs",
    )
    parser.add_argument("--host", help="listen address (env AUTH_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (env AUTH_PORT, default 8088)")
    parser.add_argument(
        "--cds-server-address",
        "--cds-url",
        dest="cds_url",
        help=f"config discovery service, host:port or http(s)://… "
        f"(env {CDS_ADDR_ENV}; default {DEFAULT_CDS_ADDRESS})",
    )
    parser.add_argument(
        "--cds-token-file",
        help="file holding the CDS bearer token (env CDS_TOKEN_FILE, else the token in CDS_TOKEN)",
    )
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    parser.add_argument("--log-format", choices=("text", "json"), help="env AUTH_LOG_FORMAT")
    add_version_argument(parser, "stunner-auth")
    return parser.parse_args(argv)


def build_server(settings: AuthSettings) -> uvicorn.Server:
    """A uvicorn server for the app; ``port=0`` picks a free port.

    The request limits of `stunner_common.io.http.limits` (head size 431, query 414, body 413, head
    deadline 408, connections per client IP 429) are enforced while uvicorn parses, and counted
    in ``stunner_auth_refusals{limit}``.
    """
    metrics = AuthMetrics()

    def refused(limit: str) -> None:
        metrics.refusals.labels(limit=limit).inc()

    return uvicorn_server(
        create_app(settings, metrics),
        settings,
        http=protocol_class(
            settings.request_limits(settings.max_connections_per_client),
            errors=ERRORS,
            on_refusal=refused,
            logger=logging.getLogger(__name__),
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from_args(
        "stunner-auth",
        AuthSettings,
        args,
        ("host", "port", "cds_url", "cds_token_file", "log_level", "log_format"),
    )
    if settings is None:
        return 2
    for warning in settings.warnings:
        print(f"stunner-auth: warning: {warning}", file=sys.stderr)
    if (problem := check_token_file(settings.cds_token_file)) is not None:
        print(f"stunner-auth: {problem}", file=sys.stderr)
        return 2
    return serve("stunner-auth", settings, build_server)


if __name__ == "__main__":
    sys.exit(main())
