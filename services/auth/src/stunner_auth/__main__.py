"""``stunner-auth``: run the authentication service (flags override ``AUTH_*``/``CDS_*``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

import uvicorn
from pydantic import ValidationError

from stunner_auth.app import create_app
from stunner_auth.settings import AuthSettings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="stunner-auth",
        description="STUNner authentication service: TURN credentials and ICE configs",
    )
    parser.add_argument("--host", help="listen address (env AUTH_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (env AUTH_PORT, default 8088)")
    parser.add_argument("--cds-url", help="config discovery service (env CDS_SERVER_ADDR)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
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


def settings_error(exc: ValidationError) -> str:
    """One line per problem, without pydantic's links and input echo (which may hold secrets)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
        for err in exc.errors()
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {
        key: value
        for key, value in {
            "host": args.host,
            "port": args.port,
            "cds_url": args.cds_url,
            "log_level": args.log_level,
        }.items()
        if value is not None
    }
    try:
        settings = AuthSettings(**overrides)
    except ValidationError as exc:
        print(f"stunner-auth: invalid settings: {settings_error(exc)}", file=sys.stderr)
        return 2
    level = getattr(logging, settings.log_level.upper(), None)
    if not isinstance(level, int):
        print(f"stunner-auth: unknown log level {settings.log_level!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = build_server(settings)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
