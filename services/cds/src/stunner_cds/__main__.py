"""``stunner-cds``: run the config discovery service (flags override ``CDS_*``/``REDIS_URL``)."""

from __future__ import annotations

import argparse
import contextlib
import sys

from stunner_cds.server import build_server
from stunner_cds.settings import CdsSettings
from stunner_common.cli import add_version_argument, settings_from_args
from stunner_common.logs import LOG_FORMATS
from stunner_common.runtime import run as run_loop


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
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, help="text or json (env CDS_LOG_FORMAT, default text)"
    )
    add_version_argument(parser, "stunner-cds")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from_args(
        "stunner-cds",
        CdsSettings,
        args,
        (
            "host",
            "port",
            "redis_url",
            "tls_cert_file",
            "tls_key_file",
            "log_level",
            "log_format",
        ),
    )
    if settings is None:
        return 2
    server = build_server(settings)
    # uvloop when installed: fanning out to many watchers is mostly socket writes.
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
