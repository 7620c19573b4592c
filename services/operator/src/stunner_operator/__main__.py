"""Command-line entry point: ``stunner-operator [--manifests DIR] [--redis-url URL]``.

Kubernetes mode (the default) watches the cluster named by ``--kubeconfig`` (or $KUBECONFIG, or
the in-cluster service account). Local mode (``--manifests``) renders a folder of Gateway API
YAML into Redis and follows the folder. ``--print`` renders the folder once and prints the
configs (canonical JSON, one per line) without Redis, which is handy to check manifests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import uuid
from pathlib import Path

from pydantic import ValidationError

from stunner_common.cli import validation_message
from stunner_common.logs import configure_logging
from stunner_common.redis_acl import redact_url
from stunner_common.runtime import run as run_loop
from stunner_operator.manifests.local import LocalOperator
from stunner_operator.publish import RedisConfigSink
from stunner_operator.render.options import RenderOptions
from stunner_operator.settings import OperatorSettings

log = logging.getLogger("stunner_operator")  # not __name__: "__main__" under python -m

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stunner-operator",
        description="Render Gateway API objects into stunnerd configs in Redis.",
    )
    p.add_argument("--manifests", type=Path, help="folder (or file) of YAML manifests: local mode")
    p.add_argument("--redis-url", help="Redis URL (env REDIS_URL)")
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig for Kubernetes mode")
    p.add_argument("--cds-address", help="host[:port] of the CDS the dataplane pods use")
    p.add_argument(
        "--print", dest="print_only", action="store_true", help="render once, print the configs"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="render --manifests once and print every object the operator would write (YAML)",
    )
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    return p


def _options(settings: OperatorSettings) -> RenderOptions:
    return RenderOptions(
        controller_name=settings.controller_name,
        cds_address=settings.cds_address,
        endpoint_discovery=settings.endpoint_discovery,
    )


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def _run_kubernetes(settings: OperatorSettings) -> int:
    from stunner_operator.k8s.api import KubeApi, KubeApiError, load_client
    from stunner_operator.k8s.controller import KubeController
    from stunner_operator.k8s.leader import LeaderElector

    try:
        client = await load_client(settings.kubeconfig)
    except KubeApiError as err:
        print(f"stunner-operator: {err}", file=sys.stderr)
        return EXIT_USAGE
    api = KubeApi(client, timeout_s=settings.kube_timeout_s)
    sink = RedisConfigSink(settings.redis_url, timeout_s=settings.redis_timeout_s)

    async def lead(lost: asyncio.Event) -> None:
        # A fresh controller per term: it lists everything again before rendering.
        controller = KubeController(
            api,
            sink,
            options=_options(settings),
            throttle_s=settings.throttle_s,
            retry_s=settings.publish_retry_s,
        )
        await controller.run(lost)

    stop = _stop_on_signals()
    log.info("Kubernetes mode: publishing to %s", redact_url(settings.redis_url))
    try:
        if settings.leader_elect:
            elector = LeaderElector(
                api,
                namespace=settings.lease_namespace,
                name=settings.lease_name,
                identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
                lease_duration_s=settings.lease_duration_s,
                renew_period_s=settings.lease_renew_s,
            )
            await elector.run(lead, stop)
        else:
            await lead(stop)
    finally:
        await sink.aclose()
        await api.aclose()
    return 0


async def _run_local(settings: OperatorSettings, root: Path) -> int:
    options = _options(settings)
    sink = RedisConfigSink(settings.redis_url, timeout_s=settings.redis_timeout_s)
    operator = LocalOperator(
        root,
        sink,
        options=options,
        debounce_ms=settings.watch_debounce_ms,
        retry_s=settings.publish_retry_s,
    )
    stop = _stop_on_signals()
    log.info("local mode: watching %s, publishing to %s", root, redact_url(settings.redis_url))
    try:
        await operator.run(stop)
    finally:
        await sink.aclose()
    return 0


def _print_once(settings: OperatorSettings, root: Path) -> int:
    operator = LocalOperator(root, None, options=_options(settings))
    operator.sync()
    for _cid, config in sorted(operator.renderer.configs().items()):
        print(config.canonical_json())
    return 1 if operator.manifests.errors else 0


def _dry_run(settings: OperatorSettings, root: Path) -> int:
    from stunner_operator.dryrun import dry_run

    result = dry_run(root, _options(settings))
    sys.stdout.write(result.yaml())
    sys.stdout.flush()
    for problem in result.problems:
        print(problem, file=sys.stderr)
    return 0


def _unreadable(path: Path) -> str | None:
    """Why ``path`` (a manifest file or folder) cannot be read, or None."""
    try:
        if path.is_dir():
            next(path.iterdir(), None)
        else:
            with path.open("rb"):
                pass
    except FileNotFoundError:
        return "no such file or folder"
    except OSError as err:
        return err.strerror or str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = {
        k: v
        for k, v in {
            "manifests": args.manifests,
            "kubeconfig": args.kubeconfig,
            "redis_url": args.redis_url,
            "cds_address": args.cds_address,
            "log_level": args.log_level,
        }.items()
        if v is not None
    }
    try:
        settings = OperatorSettings(**overrides)
    except ValidationError as err:
        print(f"stunner-operator: invalid settings: {validation_message(err)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        configure_logging(settings.log_format, settings.log_level)
    except ValueError as err:
        print(f"stunner-operator: {err}", file=sys.stderr)
        return EXIT_USAGE
    if settings.manifests is None:
        if args.print_only or args.dry_run:
            flag = "--dry-run" if args.dry_run else "--print"
            print(f"stunner-operator: {flag} needs --manifests PATH", file=sys.stderr)
            return EXIT_USAGE
        try:
            return run_loop(_run_kubernetes(settings))
        except KeyboardInterrupt:
            return 0
    if (why := _unreadable(settings.manifests)) is not None:
        print(f"stunner-operator: {settings.manifests}: {why}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        return _dry_run(settings, settings.manifests)
    if args.print_only:
        return _print_once(settings, settings.manifests)
    try:
        return run_loop(_run_local(settings, settings.manifests))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
