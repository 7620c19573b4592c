"""``stunner-auth``: run the authentication service (flags override ``AUTH_*``/``CDS_*``)."""

from __future__ import annotations

import argparse
import contextlib
import sys

import uvicorn
from pydantic import ValidationError

from stunner_auth.app import create_app
from stunner_auth.settings import AuthSettings
from stunner_common.cli import add_version_argument, validation_message
from stunner_common.logs import configure_logging
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
    overrides = {
        key: value
        for key, value in {
            "host": args.host,
            "port": args.port,
            "cds_url": args.cds_url,
            "log_level": args.log_level,
            "log_format": args.log_format,
        }.items()
        if value is not None
    }
    try:
        settings = AuthSettings(**overrides)
    except ValidationError as exc:
        print(f"stunner-auth: invalid settings: {validation_message(exc)}", file=sys.stderr)
        return 2
    try:
        configure_logging(settings.log_format, settings.log_level)
    except ValueError as exc:
        print(f"stunner-auth: {exc}", file=sys.stderr)
        return 2
    server = build_server(settings)
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
