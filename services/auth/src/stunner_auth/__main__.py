"""``stunner-auth``: run the authentication service (flags override ``AUTH_*``/``CDS_*``)."""

from __future__ import annotations

import argparse
import contextlib
import sys

import uvicorn

from stunner_auth.app import create_app
from stunner_auth.settings import AuthSettings
from stunner_common.cli import add_version_argument, settings_from_args
from stunner_common.runtime import run as run_loop


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="stunner-auth",
        description="STUNner authentication service: TURN credentials and ICE configs",
    )
    parser.add_argument("--host", help="listen address (env AUTH_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (env AUTH_PORT, default 8088)")
    parser.add_argument("--cds-url", help="config discovery service (env CDS_SERVER_ADDR)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    parser.add_argument("--log-format", choices=("text", "json"), help="env AUTH_LOG_FORMAT")
    add_version_argument(parser, "stunner-auth")
    return parser.parse_args(argv)


def build_server(settings: AuthSettings) -> uvicorn.Server:
    """A uvicorn server for the app; ``port=0`` picks a free port."""
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(max(1, settings.shutdown_timeout_s)),
    )
    return uvicorn.Server(config)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from_args(
        "stunner-auth",
        AuthSettings,
        args,
        ("host", "port", "cds_url", "log_level", "log_format"),
    )
    if settings is None:
        return 2
    server = build_server(settings)
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
