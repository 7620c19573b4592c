"""``stunner-cds``: run the config discovery service (flags override ``CDS_*``/``REDIS_URL``)."""

from __future__ import annotations

import argparse
import os
import ssl
import sys

from stunner_cds.server import build_server
from stunner_cds.settings import CdsSettings
from stunner_common.cli import add_version_argument
from stunner_common.io.http import serve
from stunner_common.logs import LOG_FORMATS
from stunner_common.process_settings import settings_from_args


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


def tls_problem(settings: CdsSettings) -> str | None:
    """Why the TLS certificate and key cannot be used (one line), or None."""
    cert, key = settings.tls_cert_file, settings.tls_key_file
    if cert is None or key is None:
        return None
    for flag, path in (("--tls-cert-file", cert), ("--tls-key-file", key)):
        if not os.access(path, os.R_OK) or not path.is_file():
            why = "no such file" if not path.exists() else "not a readable file"
            return f"{flag} {str(path)!r}: {why}"
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError:
        return (
            f"--tls-cert-file {str(cert)!r} with --tls-key-file {str(key)!r}: not a PEM "
            "certificate chain and its private key"
        )
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return f"--tls-cert-file {str(cert)!r} with --tls-key-file {str(key)!r}: {reason}"
    return None


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
    if (problem := tls_problem(settings)) is not None:
        print(f"stunner-cds: {problem}", file=sys.stderr)
        return 2
    # uvloop when installed: fanning out to many watchers is mostly socket writes.
    return serve("stunner-cds", settings, build_server)


if __name__ == "__main__":
    sys.exit(main())
