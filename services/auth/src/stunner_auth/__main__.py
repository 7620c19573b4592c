"""``stunner-auth``: run the authentication service (flags override ``AUTH_*``/``CDS_*``)."""

from __future__ import annotations

import argparse
import sys

import uvicorn

from stunner_auth.app import create_app
from stunner_auth.settings import AuthSettings
from stunner_common.cli import (
    CDS_ADDR_ENV,
    DEFAULT_CDS_ADDRESS,
    add_version_argument,
    check_token_file,
    settings_from_args,
)
from stunner_common.http import serve, uvicorn_server


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

    h11, not httptools: uvicorn's httptools protocol buffers a request head of any size, h11
    refuses one over ``max_header_bytes`` (400, closed). The API takes no body, and uvicorn
    stops reading a body its app does not read past 64 KiB.
    """
    return uvicorn_server(
        create_app(settings),
        settings,
        http="h11",
        h11_max_incomplete_event_size=settings.max_header_bytes,
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
