"""``stunner-cds``: run the config discovery service (flags override ``CDS_*``/``REDIS_URL``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable

from pydantic import ValidationError

from stunner_cds.server import build_server
from stunner_cds.settings import CdsSettings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="stunner-cds", description="STUNner config discovery service"
    )
    parser.add_argument("--host", help="listen address (env CDS_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (env CDS_PORT, default 13478)")
    parser.add_argument("--redis-url", help="config store (env REDIS_URL)")
    parser.add_argument("--tls-cert-file", help="serve https/wss with this certificate (PEM)")
    parser.add_argument("--tls-key-file", help="private key for --tls-cert-file (PEM)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {
        key: value
        for key, value in {
            "host": args.host,
            "port": args.port,
            "redis_url": args.redis_url,
            "tls_cert_file": args.tls_cert_file,
            "tls_key_file": args.tls_key_file,
            "log_level": args.log_level,
        }.items()
        if value is not None
    }
    try:
        settings = CdsSettings(**overrides)
    except ValidationError as exc:
        print(f"stunner-cds: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    level = getattr(logging, settings.log_level.upper(), None)
    if not isinstance(level, int):
        print(f"stunner-cds: unknown log level {settings.log_level!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = build_server(settings)
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=_loop_factory()) as r:
        r.run(server.serve())
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: fanning out to many watchers is mostly socket writes."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


if __name__ == "__main__":
    sys.exit(main())
