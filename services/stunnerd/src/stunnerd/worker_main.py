"""A worker process's edge: its command line and environment, then `stunnerd.workers.child`.

`WorkerPool` starts each worker as `python -m stunnerd.worker_main` with its settings on the
command line (as JSON) and the secrets it needs (the cluster-wide quota's Redis URL) in its
environment, read here through `stunnerd.settings` as the supervisor's are in `stunnerd.cli`, and
only with `--quota`: a worker without a quota never imports the settings module (and the config
models under it) nor redis. The command line becomes one `ChildOptions` (`child_options`), the
quota a `ClusterQuota`; `stunnerd.workers.child.serve` runs with both.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from stunner_common.cli import HelpFormatter
from stunner_common.loglevel import apply_log_spec
from stunner_common.logs import LOG_FORMATS, configure_logging
from stunner_common.runtime import run as run_loop
from stunnerd.net.guard import ClientLimits
from stunnerd.net.tuning import ServerTuning
from stunnerd.workers.child import ChildOptions, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stunnerd-worker", formatter_class=HelpFormatter)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--log", default=None, help="log spec that overrides the config's")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    parser.add_argument("--tuning", default=None, help="ServerTuning as JSON (default: defaults)")
    parser.add_argument("--limits", default=None, help="ClientLimits as JSON (default: defaults)")
    parser.add_argument("--relay-addresses", default="", help="comma-separated relay IPs")
    parser.add_argument(
        "--fd-channel", type=int, default=None, help="Unix socket carrying listener sockets"
    )
    parser.add_argument("--quota", default=None, help="QuotaSettings as JSON, without the URL")
    parser.add_argument("--node-address", default="", help="the node's address (placeholder)")
    parser.add_argument("--libbpf", default="", help="the libbpf the kernel offload loads")
    parser.add_argument(
        "--no-journal",
        action="store_true",
        help="journal no allocation to the supervisor (STUNNERD_WORKER_JOURNAL=false)",
    )
    return parser


def child_options(args: argparse.Namespace) -> ChildOptions:
    """What `serve` runs with, from the parsed command line."""
    return ChildOptions(
        index=args.index,
        bind_host=args.bind,
        relay_addresses=tuple(ip for ip in args.relay_addresses.split(",") if ip),
        node_address=args.node_address,
        tuning=ServerTuning.from_json(args.tuning) if args.tuning else ServerTuning(),
        limits=ClientLimits.from_json(args.limits) if args.limits else ClientLimits(),
        log_override=args.log,
        fd_channel=args.fd_channel,
        journal=not args.no_journal,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = child_options(args)
    configure_logging(args.log_format, tag=f"worker-{args.index}")
    apply_log_spec(args.log or "all:INFO")
    # The supervisor owns the lifecycle (drain, grace period); a terminal's Ctrl-C or a signal
    # to the process group must not kill the workers under it. A worker ends when stdin closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.libbpf:
        from stunnerd.offload.libbpf import Libbpf

        Libbpf.library = args.libbpf
    quota = None
    if args.quota:
        from stunnerd.quota import ClusterQuota, QuotaSettings
        from stunnerd.settings import worker_environment

        env = worker_environment()
        settings = QuotaSettings.from_worker_json(args.quota, env.quota_redis_url)
        quota = ClusterQuota(settings, f"{socket.gethostname()}-{os.getpid()}")
    return run_loop(serve(options, quota))


if __name__ == "__main__":
    sys.exit(main())
