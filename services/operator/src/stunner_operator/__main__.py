"""Command-line entry point: ``stunner-operator [--manifests DIR] [--redis-url URL]``.

Kubernetes mode (the default) watches the cluster named by ``--kubeconfig`` (or $KUBECONFIG, or
the in-cluster service account). Local mode (``--manifests``) renders a folder of Gateway API
YAML into Redis and follows the folder. ``--print`` renders the folder once and prints the
configs (canonical JSON, one per line) without Redis, which is handy to check manifests.
"""

# ruff: noqa: E402  (the collector is switched off before the imports)
from __future__ import annotations

import gc

# Start-up is mostly imports (pydantic models, redis, the renderer) that build objects living as
# long as the process: the cyclic collector would scan them over and over for nothing. It stays
# off while they load and they are then frozen out of its way, which saves about a tenth of the
# CPU a restarted operator spends before its first publish.
gc.disable()

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from stunner_common.cli import add_version_argument
from stunner_common.process_settings import settings_from_args
from stunner_common.redis_acl import redact_url
from stunner_common.runtime import run as run_loop
from stunner_operator.manifests.local import LocalOperator, LocalOptions
from stunner_operator.observe import ObservabilityServer, OperatorMetrics, parse_address
from stunner_operator.publish import PublishError, RedisConfigSink
from stunner_operator.render.options import RenderOptions, parse_label_filter
from stunner_operator.settings import OperatorSettings

if TYPE_CHECKING:
    from stunner_operator.controller.leader import LeaderOptions
    from stunner_operator.controller.loops import ControllerOptions

log = logging.getLogger("stunner_operator")  # not __name__: "__main__" under python -m

gc.freeze()
gc.enable()
# Each watch event of a large EndpointSlice and each render allocate thousands of container
# objects that live until the next event of that slice: with the default threshold (700) the
# youngest generation is collected several times per event and the survivors are scanned again
# in the next one. Under endpoint churn (docs/scale.md) collections took a seventh of the
# operator's CPU; a threshold of 10,000 took 8 % off its CPU for the same writes.
GC_YOUNG_THRESHOLD = 10_000
gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line and exit 2 (argparse would print the whole usage first)."""
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="stunner-operator",
        description="Render Gateway API objects into stunnerd configs in Redis.",
    )
    add_version_argument(p, "stunner-operator")
    p.add_argument("--manifests", type=Path, help="folder (or file) of YAML manifests: local mode")
    p.add_argument("--redis-url", help="Redis URL (env REDIS_URL)")
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig for Kubernetes mode")
    p.add_argument("--cds-address", help="host[:port] of the CDS the dataplane pods use")
    p.add_argument(
        "--cds-token-secret",
        help="Secret the dataplane pods read CDS_TOKEN from (key 'token'; env"
        " OPERATOR_CDS_TOKEN_SECRET)",
    )
    p.add_argument(
        "--enforce-reference-grants",
        action="store_const",
        const=True,
        default=None,
        help="cross-namespace backendRefs and certificateRefs need a ReferenceGrant (env"
        " OPERATOR_ENFORCE_REFERENCE_GRANTS=true; default: upstream's, no grant needed)",
    )
    p.add_argument(
        "--print", dest="print_only", action="store_true", help="render once, print the configs"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="render --manifests once and print every object the operator would write (YAML)",
    )
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    p.add_argument(
        "--health-address",
        help="HOST:PORT of /healthz and /readyz (default :8081; '' turns them off)",
    )
    p.add_argument(
        "--metrics-address", help="HOST:PORT of /metrics (default :8080; '' turns it off)"
    )
    return p


def _options(settings: OperatorSettings) -> RenderOptions:
    return RenderOptions(
        controller_name=settings.controller_name,
        cds_address=settings.cds_address,
        cds_token_secret=settings.cds_token_secret,
        cds_token_key=settings.cds_token_secret_key,
        endpoint_discovery=settings.endpoint_discovery,
        label_filter=parse_label_filter(settings.label_filter),
        quota_redis_secret=settings.quota_redis_secret,
        quota_redis_key=settings.quota_redis_secret_key,
        enforce_reference_grants=settings.enforce_reference_grants,
    )


def _local_options(settings: OperatorSettings) -> LocalOptions:
    return LocalOptions(
        render=_options(settings),
        debounce_ms=settings.watch_debounce_ms,
        retry_s=settings.publish_retry_s,
    )


def _controller_options(settings: OperatorSettings) -> ControllerOptions:
    from stunner_operator.controller.loops import ControllerOptions
    from stunner_operator.k8s.resources import watched

    return ControllerOptions(
        render=_options(settings),
        throttle_s=settings.throttle_s,
        writers=settings.writers,
        retry_s=settings.publish_retry_s,
        watch_timeout_s=settings.watch_timeout_s,
        resources=watched(enforce_reference_grants=settings.enforce_reference_grants),
    )


def _leader_options(settings: OperatorSettings) -> LeaderOptions:
    from stunner_operator.controller.leader import LeaderOptions

    return LeaderOptions(
        namespace=settings.lease_namespace,
        name=settings.lease_name,
        identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        lease_duration_s=settings.lease_duration_s,
        renew_period_s=settings.lease_renew_s,
    )


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


class _StartupError(Exception):
    """A one-line reason to exit with status 2 before the operator runs."""


async def _redis_sink(settings: OperatorSettings) -> RedisConfigSink:
    """A sink whose Redis answered within ``redis_startup_timeout_s``."""
    try:
        sink = RedisConfigSink(settings.redis_url, timeout_s=settings.redis_timeout_s)
    except ValueError as err:
        url = redact_url(settings.redis_url)
        raise _StartupError(f"invalid Redis URL {url!r}: {err}") from err
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.redis_startup_timeout_s
    attempt = 0
    while True:
        attempt += 1
        try:
            await sink.ping()
            return sink
        except PublishError as err:
            if loop.time() >= deadline:
                await sink.aclose()
                url = redact_url(settings.redis_url)
                raise _StartupError(f"cannot reach Redis at {url}: {err}") from err
            if attempt in (1, 10) or attempt % 30 == 0:
                log.warning("waiting for Redis at %s: %s", redact_url(settings.redis_url), err)
            await asyncio.sleep(min(1.0, max(0.0, deadline - loop.time())))


def _server(settings: OperatorSettings, metrics: OperatorMetrics) -> ObservabilityServer:
    try:
        health = (
            parse_address(settings.health_address, "--health-address")
            if settings.health_address
            else None
        )
        prom = (
            parse_address(settings.metrics_address, "--metrics-address")
            if settings.metrics_address
            else None
        )
    except ValueError as err:
        raise _StartupError(str(err)) from err
    return ObservabilityServer(metrics, health_address=health, metrics_address=prom)


@contextlib.asynccontextmanager
async def _serving(server: ObservabilityServer) -> AsyncIterator[None]:
    try:
        await server.start()
    except OSError as err:
        raise _StartupError(f"cannot serve health or metrics: {err.strerror or err}") from err
    try:
        yield
    finally:
        await server.close()


async def _run_kubernetes(settings: OperatorSettings) -> int:
    from stunner_common.io.kube.api import KubeApi, KubeApiError, load_access
    from stunner_operator.controller.leader import LeaderElector
    from stunner_operator.controller.loops import KubeController

    metrics = OperatorMetrics()
    server = _server(settings, metrics)
    options = _controller_options(settings)
    try:
        # A kubeconfig's credential plugin may run for a while: off the loop.
        access = await asyncio.to_thread(load_access, settings.kubeconfig, settings.environ)
    except KubeApiError as err:
        raise _StartupError(str(err)) from err
    api = KubeApi(access, timeout_s=settings.kube_timeout_s)
    try:
        sink = await _redis_sink(settings)
    except _StartupError:
        await api.aclose()
        raise

    async def lead(lost: asyncio.Event) -> None:
        # A fresh controller per term: it lists everything again before rendering.
        controller = KubeController(api, sink, options, metrics=metrics)
        await controller.run(lost)

    stop = _stop_on_signals()
    log.info("Kubernetes mode: publishing to %s", redact_url(settings.redis_url))
    try:
        async with _serving(server):
            if settings.leader_elect:
                elector = LeaderElector(api, _leader_options(settings), metrics=metrics)
                await elector.run(lead, stop)
            else:
                metrics.mark_leading()
                await lead(stop)
    finally:
        await sink.aclose()
        await api.aclose()
    return 0


async def _run_local(settings: OperatorSettings, root: Path) -> int:
    metrics = OperatorMetrics()
    server = _server(settings, metrics)
    sink = await _redis_sink(settings)
    operator = LocalOperator(root, sink, _local_options(settings), metrics=metrics)
    server.gateway_report = operator.gateway_report
    stop = _stop_on_signals()
    log.info("local mode: watching %s, publishing to %s", root, redact_url(settings.redis_url))
    try:
        async with _serving(server):
            await operator.run(stop)
    finally:
        await sink.aclose()
    return 0


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        return run_loop(coro)
    except KeyboardInterrupt:
        return 0
    except _StartupError as err:
        print(f"stunner-operator: {err}", file=sys.stderr)
        return EXIT_USAGE


def _print_once(settings: OperatorSettings, root: Path) -> int:
    operator = LocalOperator(root, None, _local_options(settings))
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
    settings = settings_from_args(
        "stunner-operator",
        OperatorSettings,
        args,
        (
            "manifests",
            "kubeconfig",
            "redis_url",
            "cds_address",
            "cds_token_secret",
            "enforce_reference_grants",
            "log_level",
            "health_address",
            "metrics_address",
        ),
    )
    if settings is None:
        return EXIT_USAGE
    if settings.manifests is None:
        if args.print_only or args.dry_run:
            flag = "--dry-run" if args.dry_run else "--print"
            print(f"stunner-operator: {flag} needs --manifests PATH", file=sys.stderr)
            return EXIT_USAGE
        return _run(_run_kubernetes(settings))
    if (why := _unreadable(settings.manifests)) is not None:
        print(f"stunner-operator: {settings.manifests}: {why}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        return _dry_run(settings, settings.manifests)
    if args.print_only:
        return _print_once(settings, settings.manifests)
    return _run(_run_local(settings, settings.manifests))


if __name__ == "__main__":
    sys.exit(main())
