"""The managed dataplane: follow a config origin, reconcile, serve health and metrics, drain.

`run(settings)` is the whole life of a `stunnerd` process. It builds the dataplane (this process,
or `--udp-thread-num` worker processes), loads or watches the config origin, applies each config
as a delta, keeps `/ready` false until the first real config is in force, and on SIGTERM turns
`/ready` to 503, refuses new allocations and exits once the last allocation ends or the grace
period runs out (SIGINT does the same with a shorter grace period; a second signal exits at once).
A config that fails to apply is logged and the previous one keeps serving; a one-shot load that
fails exits with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from stunner_common.config import DEFAULT_HEALTHCHECK_ENDPOINT, ConfigError, StunnerConfig
from stunner_common.loglevel import apply_log_spec
from stunner_common.turnuri import default_config_from_uri
from stunnerd.admin.health import Lifecycle
from stunnerd.admin.servers import AdminServers
from stunnerd.drain import drain
from stunnerd.origin.base import (
    DEFAULT_ORIGIN,
    ConfigOrigin,
    ConfigOriginError,
    parse_origin,
    resolve_id,
)
from stunnerd.origin.cds import CdsOrigin
from stunnerd.origin.file import FileOrigin
from stunnerd.reconcile.plan import Plan
from stunnerd.workers.base import ApplyOutcome, Dataplane

log = logging.getLogger("stunnerd")

EXIT_OK = 0
EXIT_CONFIG = 1
DEFAULT_GRACE_PERIOD_S = 3600.0
DEFAULT_SIGINT_GRACE_PERIOD_S = 5.0


@dataclass(frozen=True, slots=True)
class DataplaneSettings:
    """Everything `run` needs, built once from the command line and the environment."""

    origin: str = DEFAULT_ORIGIN
    watch: bool = False
    turn_uri: str | None = None
    namespace: str = "default"
    name: str = "stunnerd"
    node: str | None = None
    log_spec: str | None = None
    log_format: Literal["text", "json"] = "text"
    udp_thread_num: int = 0
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    sigint_grace_period_s: float = DEFAULT_SIGINT_GRACE_PERIOD_S
    force_ready: bool = False
    bind_host: str = "0.0.0.0"
    file_poll_interval_s: float = 0.2
    bootstrap_health_endpoint: str = DEFAULT_HEALTHCHECK_ENDPOINT
    """Where /live answers in watch mode before the first config names an endpoint."""
    health_port_override: int | None = None
    """Serve health checks on this port whatever the config says (several on one host)."""


def settings_from_env(
    *,
    config: str | None,
    watch: bool,
    turn_uri: str | None,
    ident: str | None,
    env: Mapping[str, str],
    **rest: object,
) -> DataplaneSettings:
    """Resolve the origin (flag > STUNNER_CONFIG_ORIGIN > default) and the CDS identity."""
    namespace, name = resolve_id(ident, env)
    origin = config or env.get("STUNNER_CONFIG_ORIGIN") or DEFAULT_ORIGIN
    return DataplaneSettings(
        origin=origin,
        watch=watch,
        turn_uri=turn_uri,
        namespace=namespace,
        name=name,
        node=env.get("STUNNER_NODENAME") or None,
        **rest,  # type: ignore[arg-type]
    )


class JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"))


def configure_logging(log_format: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def make_origin(settings: DataplaneSettings, env: Mapping[str, str]) -> ConfigOrigin:
    spec = parse_origin(settings.origin)
    if spec.kind == "file":
        # Zero (delete) configs reach the reconciler, which ignores them and counts them in
        # /status: a dataplane being drained must keep its listeners (upstream's suppressDelete).
        return FileOrigin(
            spec.location,
            env=env,
            poll_interval_s=settings.file_poll_interval_s,
            suppress_delete=False,
        )
    return CdsOrigin(
        spec.location,
        settings.namespace,
        settings.name,
        node=settings.node,
        env=env,
        suppress_delete=False,
    )


def make_dataplane(settings: DataplaneSettings) -> Dataplane:
    if settings.udp_thread_num > 1:
        from stunnerd.workers.pool import WorkerPool

        return WorkerPool(
            settings.udp_thread_num, bind_host=settings.bind_host, log_spec=settings.log_spec
        )
    from stunnerd.net.server import TurnServer
    from stunnerd.workers.local import LocalDataplane

    return LocalDataplane(TurnServer(bind_host=settings.bind_host))


class ManagedDataplane:
    """The running process: dataplane, admin servers, lifecycle and the config being served."""

    def __init__(self, settings: DataplaneSettings, dataplane: Dataplane) -> None:
        self.settings = settings
        self.dataplane = dataplane
        self.lifecycle = Lifecycle(force_ready=settings.force_ready)
        self.admin = AdminServers(
            self.lifecycle,
            dataplane.stats,
            log_override=settings.log_spec,
            refresh=dataplane.refresh,
            health_port=settings.health_port_override,
        )
        self.revision: int | None = None
        self.applied_count = 0
        self.rejected_count = 0
        self.ignored_count = 0
        self.admin.revision = lambda: self.revision
        self.admin.config_counts = lambda: {
            "applied": self.applied_count,
            "rejected": self.rejected_count,
            "ignored": self.ignored_count,
        }
        worker_status = getattr(dataplane, "worker_status", None)
        if worker_status is not None:
            self.admin.extra_status = lambda: {"workers": worker_status()}

    async def apply(self, config: StunnerConfig, revision: int | None = None) -> ApplyOutcome:
        received = time.perf_counter()
        outcome = await self.dataplane.apply(config)
        if outcome.error is not None:
            self.rejected_count += 1
            log.error("config not applied, running configuration unchanged: %s", outcome.error)
            return outcome
        if outcome.ignored:
            self.ignored_count += 1
            return outcome
        try:
            await self.admin.apply_admin(config, Plan())
        except (OSError, ValueError) as exc:
            log.error("admin servers: %s", exc)
        if revision is not None:
            self.revision = revision
        self.applied_count += 1
        for name, port in outcome.started:
            # A stable line on stdout that scripts and tests wait for.
            print(f"stunnerd: listener {name} ready on port {port}", flush=True)
        if not self.lifecycle.draining:
            self.lifecycle.ready = True
        log.debug("config handled in %.1f ms", (time.perf_counter() - received) * 1e3)
        return outcome

    async def follow(self, origin: ConfigOrigin) -> None:
        async for event in origin.watch():
            if self.lifecycle.draining:
                return
            try:
                await self.apply(event.config, event.revision)
            except Exception:
                # Never let one bad apply end the watch: the running config stays in force.
                self.rejected_count += 1
                log.exception("applying a config failed unexpectedly")


async def run(settings: DataplaneSettings, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    loop = asyncio.get_running_loop()
    dataplane = make_dataplane(settings)
    app = ManagedDataplane(settings, dataplane)
    signals: asyncio.Queue[int] = asyncio.Queue()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    follow: asyncio.Task[None] | None = None
    try:
        await dataplane.start()
        if settings.turn_uri is not None:
            try:
                config = default_config_from_uri(settings.turn_uri)
            except ConfigError as exc:
                print(f"stunnerd: invalid TURN URI: {exc}", file=sys.stderr)
                return EXIT_CONFIG
            if (await app.apply(config)).error is not None:
                return EXIT_CONFIG
        else:
            try:
                origin = make_origin(settings, env)
            except ConfigOriginError as exc:
                print(f"stunnerd: {exc}", file=sys.stderr)
                return EXIT_CONFIG
            spec = parse_origin(settings.origin)
            if settings.watch or spec.kind == "ws":
                try:
                    await app.admin.start_health(settings.bootstrap_health_endpoint)
                except OSError as exc:
                    log.error("health server: %s", exc)
            else:
                try:
                    event = await origin.load()
                except ConfigOriginError as exc:
                    print(f"stunnerd: {exc}", file=sys.stderr)
                    return EXIT_CONFIG
                outcome = await app.apply(event.config, event.revision)
                if outcome.error is not None:
                    print(f"stunnerd: {outcome.error}", file=sys.stderr)
                    return EXIT_CONFIG
            if settings.watch or spec.kind in ("ws", "file"):
                follow = asyncio.create_task(app.follow(origin), name="stunnerd-config-watch")
                follow.add_done_callback(_log_unexpected_exit)
        first = await signals.get()
        log.info("%s received: draining", signal.Signals(first).name)
        if follow is not None:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
        abort = asyncio.Event()
        second = asyncio.create_task(_second_signal(signals, abort), name="stunnerd-abort")
        grace = settings.grace_period_s
        if first == signal.SIGINT:
            grace = min(grace, settings.sigint_grace_period_s)
        try:
            await drain(
                app.lifecycle,
                allocations=dataplane.allocations,
                stop_accepting=dataplane.stop_accepting,
                grace_period_s=grace,
                abort=abort,
            )
        finally:
            second.cancel()
            await asyncio.gather(second, return_exceptions=True)
        return EXIT_OK
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if follow is not None and not follow.done():
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
        await app.admin.close()
        await dataplane.close()


async def _second_signal(signals: asyncio.Queue[int], abort: asyncio.Event) -> None:
    sig = await signals.get()
    log.warning("%s received again: exiting now", signal.Signals(sig).name)
    abort.set()


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("task %s failed: %r", task.get_name(), exc, exc_info=exc)
    else:
        log.error("task %s ended unexpectedly", task.get_name())


def install_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stunnerd", description="STUNner dataplane: a TURN relay driven by the Gateway API"
    )
    parser.add_argument("uri", nargs="?", help="a TURN URI: serve the default config it implies")
    parser.add_argument(
        "-c",
        "--config",
        help="config origin: a file path (watched), http(s)://CDS (one-shot) or ws(s)://CDS "
        "(watch); default $STUNNER_CONFIG_ORIGIN, else :13478",
    )
    parser.add_argument("-w", "--watch", action="store_true", help="follow the origin for updates")
    parser.add_argument("-i", "--id", help="<namespace>/<name> toward the CDS")
    parser.add_argument("-l", "--log", help="log level spec (overrides the config's loglevel)")
    parser.add_argument("-v", "--verbose", action="store_true", help="same as -l all:DEBUG")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument(
        "-u",
        "--udp-thread-num",
        type=int,
        default=0,
        help="worker processes sharing each listener port with SO_REUSEPORT (0 or 1: one)",
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
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format)
    log_spec = args.log or ("all:DEBUG" if args.verbose else None)
    if log_spec:
        apply_log_spec(log_spec)
    if args.udp_thread_num < 0:
        print("stunnerd: --udp-thread-num must not be negative", file=sys.stderr)
        return EXIT_CONFIG
    health_port = env.get("STUNNERD_HEALTH_PORT")
    try:
        settings = settings_from_env(
            config=args.config,
            watch=args.watch,
            turn_uri=args.uri,
            ident=args.id,
            env=env,
            log_spec=log_spec,
            log_format=args.log_format,
            udp_thread_num=args.udp_thread_num,
            grace_period_s=args.grace_period,
            force_ready=args.force_ready_status,
            bind_host=args.bind or env.get("STUNNERD_BIND_HOST", "0.0.0.0"),
            health_port_override=int(health_port) if health_port else None,
        )
    except (ConfigOriginError, ValueError) as exc:
        print(f"stunnerd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    install_uvloop()
    return asyncio.run(run(settings, env))


if __name__ == "__main__":
    sys.exit(main())
