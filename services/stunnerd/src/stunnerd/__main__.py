"""`stunnerd`: run the TURN dataplane from a config file or from a TURN URI.

`stunnerd -c CONFIG` loads a stunnerd config (YAML or JSON, v1 or v1alpha1, `$VAR` substitution)
and serves its listeners; `stunnerd turn://user:pass@host:port?transport=udp` serves the default
config that URI implies (one listener that admits any peer). A bad config or a listener that
cannot start is reported on stderr with exit status 1. SIGINT/SIGTERM close the listeners and
exit 0. uvloop is used when it is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from stunner_common.config import ConfigError, StunnerConfig, load_config_file
from stunner_common.loglevel import apply_log_spec
from stunner_common.turnuri import default_config_from_uri
from stunnerd.net.server import ListenerError, TurnServer

log = logging.getLogger("stunnerd")

EXIT_CONFIG = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stunnerd", description=__doc__.split("\n")[0])
    parser.add_argument("uri", nargs="?", help="a TURN URI: serve the default config it implies")
    parser.add_argument("-c", "--config", help="config file (path or file://path)")
    parser.add_argument("-l", "--log", help="log level spec, e.g. all:INFO,turn:DEBUG")
    parser.add_argument("-v", "--verbose", action="store_true", help="same as -l all:DEBUG")
    parser.add_argument(
        "--bind",
        default=os.environ.get("STUNNERD_BIND_HOST", "0.0.0.0"),
        help="address listener and relay sockets bind (default: the wildcard 0.0.0.0)",
    )
    return parser


def load(args: argparse.Namespace) -> StunnerConfig:
    if args.uri:
        return default_config_from_uri(args.uri)
    origin = args.config or os.environ.get("STUNNER_CONFIG_ORIGIN")
    if not origin:
        raise ConfigError("no config: give -c CONFIG or a turn:// URI")
    path = origin.removeprefix("file://")
    return load_config_file(path)


def install_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(config: StunnerConfig, bind_host: str) -> int:
    server = TurnServer(bind_host=bind_host)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        for listener in config.listeners:
            server.check_listener(listener)
        await server.apply_config(config)
    except (ListenerError, ConfigError) as exc:
        print(f"stunnerd: {exc}", file=sys.stderr)
        await server.close()
        return EXIT_CONFIG
    for name in server.listeners:
        print(f"stunnerd: listener {name} ready on port {server.port_of(name)}", flush=True)
    await stop.wait()
    log.info("shutting down: %d allocations dropped", server.allocation_count)
    await server.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
        level=logging.INFO,
    )
    try:
        config = load(args)
    except ConfigError as exc:
        print(f"stunnerd: invalid config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    apply_log_spec(args.log or ("all:DEBUG" if args.verbose else config.admin.loglevel))
    install_uvloop()
    return asyncio.run(serve(config, args.bind))


if __name__ == "__main__":
    sys.exit(main())
