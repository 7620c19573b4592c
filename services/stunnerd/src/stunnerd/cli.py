"""The `stunnerd` command line: flags, logging set-up, the settings, then `stunnerd.app.run`.

This is the edge where the process is configured: the flags and the environment become one
`StunnerdSettings`, logging handlers are installed (`stunner_common.logs`: text, or JSON lines
on stderr) and the event loop is started (`stunner_common.runtime`: uvloop when installed).
Everything below receives what it needs as arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from stunner_common.cli import HelpFormatter, add_version_argument
from stunner_common.config import ConfigError
from stunner_common.config.errors import ConfigValidationError
from stunner_common.loglevel import apply_log_spec, parse_log_spec
from stunner_common.logs import LOG_FORMATS, configure_logging
from stunner_common.runtime import run as run_loop
from stunner_common.turnuri import default_config_from_uri
from stunnerd.app import EXIT_CONFIG, dry_run, run
from stunnerd.origin.base import ConfigOriginError, is_k8s_origin, parse_origin
from stunnerd.settings import DEFAULT_GRACE_PERIOD_S, SettingsError, environment, load_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stunnerd",
        description="STUNner dataplane: a TURN relay driven by the Gateway API",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("uri", nargs="?", help="a TURN URI: serve the default config it implies")
    parser.add_argument(
        "-c",
        "--config",
        help="config origin: a file path (watched), http(s)://CDS (one-shot), ws(s)://CDS "
        "(watch) or k8s (the CDS found through the kubeconfig); default "
        "$STUNNER_CONFIG_ORIGIN, else :13478",
    )
    parser.add_argument("-w", "--watch", action="store_true", help="follow the origin for updates")
    parser.add_argument("-i", "--id", help="<namespace>/<name> toward the CDS")
    parser.add_argument("-l", "--log", help="log level spec (overrides the config's loglevel)")
    parser.add_argument("-v", "--verbose", action="store_true", help="same as -l all:DEBUG")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    parser.add_argument(
        "-u",
        "--udp-thread-num",
        type=int,
        default=0,
        help="worker processes sharing each listener port with SO_REUSEPORT (0 or 1: one)",
    )
    parser.add_argument(
        "--handoff-socket",
        default=None,
        help="take over a running stunnerd's sockets and allocations at this Unix socket, "
        "and listen there for a successor; SIGUSR2 starts that successor",
    )
    parser.add_argument(
        "--handoff-idle",
        action="store_true",
        help="after handing over, wait serving nothing until SIGTERM, then exit 0 "
        "(default $STUNNERD_HANDOFF_IDLE; for pods, which would otherwise be restarted)",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=DEFAULT_GRACE_PERIOD_S,
        help="seconds to wait for allocations to end after SIGTERM",
    )
    parser.add_argument(
        "--force-ready-status", action="store_true", help="keep /ready at 200 while draining"
    )
    parser.add_argument(
        "--bind",
        default=None,
        help="address listener and relay sockets bind (default $STUNNERD_BIND_HOST or 0.0.0.0)",
    )
    parser.add_argument(
        "--cds-token-file",
        default=None,
        help="file holding the CDS bearer token, re-read when it changes "
        "(default $CDS_TOKEN_FILE, else the token in $CDS_TOKEN)",
    )
    parser.add_argument(
        "-d",
        "--dry-run",
        action="store_true",
        help="load the config once, check it (listeners included), say whether it is valid and "
        "exit, binding nothing",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="with -c k8s: the kubeconfig to find the CDS with (default $KUBECONFIG, else "
        "~/.kube/config)",
    )
    parser.add_argument("--context", default=None, help="with -c k8s: the kubeconfig context")
    parser.add_argument(
        "--cds-server-namespace",
        default=None,
        help="with -c k8s: the CDS pod's namespace (default $CDS_SERVER_NAMESPACE, else any)",
    )
    add_version_argument(parser, "stunnerd")
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = environment() if env is None else env
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format)
    log_spec = args.log or ("all:DEBUG" if args.verbose else None)
    if log_spec and not parse_log_spec(log_spec):
        print(
            f"stunnerd: invalid log spec {log_spec!r}: expected scope:LEVEL[,scope:LEVEL...], "
            "e.g. all:INFO",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if log_spec:
        apply_log_spec(log_spec)
    if args.udp_thread_num < 0:
        print("stunnerd: --udp-thread-num must not be negative", file=sys.stderr)
        return EXIT_CONFIG
    try:
        settings = load_settings(
            env,
            config=args.config,
            watch=args.watch,
            turn_uri=args.uri,
            ident=args.id,
            log_spec=log_spec,
            log_format=args.log_format,
            udp_thread_num=args.udp_thread_num,
            grace_period_s=args.grace_period,
            force_ready=args.force_ready_status,
            bind_host=args.bind,
            cds_token_file=args.cds_token_file,
            handoff_socket=args.handoff_socket,
            handoff_idle=args.handoff_idle,
        )
        # A malformed origin or TURN URI is a usage error, said before anything starts.
        parse_origin(settings.origin)
        if settings.turn_uri is not None:
            default_config_from_uri(settings.turn_uri)
    except SettingsError as exc:
        print(f"stunnerd: invalid settings: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (ConfigOriginError, ConfigError, ValueError) as exc:
        print(f"stunnerd: {_one_line(exc)}", file=sys.stderr)
        return EXIT_CONFIG
    runner = dry_run if args.dry_run else run
    if is_k8s_origin(settings.origin):
        # The Kubernetes client (httpx, websockets) is imported only for `-c k8s`.
        from stunner_common.io.kube import KubeOptions
        from stunnerd.origin.k8s import run_with_k8s_origin

        kube = KubeOptions(args.kubeconfig, args.context, args.cds_server_namespace)
        return int(run_loop(run_with_k8s_origin(settings, settings.environ, kube, runner)))
    return run_loop(runner(settings))


def _one_line(exc: Exception) -> str:
    if isinstance(exc, ConfigValidationError):
        return exc.message  # "invalid TURN URI '…': …", without the field name before it
    return str(exc)
