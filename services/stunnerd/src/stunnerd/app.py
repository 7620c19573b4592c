"""The managed dataplane: follow a config origin, reconcile, serve health and metrics, drain.

`run(settings)` is the whole life of a `stunnerd` process. It builds the dataplane (this process,
or `--udp-thread-num` worker processes), loads or watches the config origin, applies each config
through the `Reconciler` (dataplane, then admin endpoints), keeps `/ready` true exactly while at
least one listener serves, retries the listeners that could not come up with capped backoff, and
on SIGTERM turns `/ready` to 503, refuses new allocations and exits once the last allocation ends
or the grace period runs out (SIGINT does the same with a shorter grace period; a second signal
exits at once). A config refused whole is logged and counted with its reason in `/status`, and the
previous one keeps serving; a one-shot load that fails exits with status 1. The command line and
the environment are read once, in `stunnerd.cli`, into the `StunnerdSettings` passed in here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stunner_common.backoff import Backoff
from stunner_common.config import ConfigError, StunnerConfig
from stunner_common.turnuri import default_config_from_uri
from stunnerd.admin.servers import AdminServers, StatusSources
from stunnerd.drain import drain
from stunnerd.handoff.succession import idle, serve_handoff, signal_or_handoff, successor_on_sigusr2
from stunnerd.origin.base import ConfigOrigin, ConfigOriginError, parse_origin
from stunnerd.origin.file import FileOrigin
from stunnerd.reconcile.dataplane import Dataplane
from stunnerd.reconcile.reconciler import Reconciler
from stunnerd.reconcile.retry import ListenerRetry
from stunnerd.settings import StunnerdSettings
from stunnerd.status import ApplyOutcome, Lifecycle

if TYPE_CHECKING:
    from stunnerd.handoff.local import Successor
    from stunnerd.handoff.transport.channel import HandoffServer
    from stunnerd.handoff.transport.named import NamedSocket
    from stunnerd.quota import ClusterQuota

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_CONFIG = 1
FIRST_CONFIG_TIMEOUT_S = 8.0  # a successor's wait for its first config (< HANDOFF_TIMEOUT_S)


class ConfigExit(Exception):
    """The first config cannot be served: the message (if any) goes to stderr, the exit status
    is `EXIT_CONFIG`."""


def make_origin(settings: StunnerdSettings) -> ConfigOrigin:
    spec = parse_origin(settings.origin)
    if spec.kind == "file":
        # Zero (delete) configs reach the reconciler, which ignores them and counts them in
        # /status: a dataplane being drained must keep its listeners (upstream's suppressDelete).
        return FileOrigin(
            spec.location,
            env=settings.environ,
            poll_interval_s=settings.file_poll_interval_s,
            suppress_delete=False,
        )
    # The CDS client (httpx, websockets, jsonpatch) is imported only for an http(s)/ws(s) origin.
    from stunner_common.io.cds import TokenSource
    from stunnerd.origin.cds import CdsOptions, CdsOrigin

    # --cds-token-file, else CDS_TOKEN_FILE, else CDS_TOKEN (a file is re-read when it changes)
    path = settings.cds_token_file or settings.cds_token_env_file
    token = settings.cds_token
    return CdsOrigin(
        spec.location,
        CdsOptions(settings.namespace, settings.name, node=settings.node, suppress_delete=False),
        env=settings.environ,
        token=TokenSource(file=path) if path else TokenSource(token) if token else None,
    )


def make_dataplane(settings: StunnerdSettings, successor: Successor | None = None) -> Dataplane:
    if settings.libbpf or settings.offload_object:
        # Which libbpf and BPF object the kernel offload loads: one each per process. The
        # offload's modules (with ctypes) load only when one is named or an engine starts.
        from stunnerd.offload.datapath import Datapath
        from stunnerd.offload.libbpf import Libbpf

        Libbpf.library = settings.libbpf
        Datapath.object_file = settings.offload_object
    if settings.udp_thread_num > 1:
        from stunnerd.workers.pool import WorkerPool

        pool = WorkerPool(
            settings.udp_thread_num,
            bind_host=settings.bind_host,
            log_spec=settings.log_spec,
            log_format=settings.log_format,
            tuning=settings.tuning,
            limits=settings.limits,
            relay_addresses=settings.relay_address_list(),
            quota=settings.quota,
            node_address=settings.node_address,
            timeouts=settings.worker_timeouts,
            journal=settings.worker_journal,
            nonce_key=successor.state.nonce_key if successor is not None else None,
            libbpf=settings.libbpf,
        )
        if successor is not None:
            from stunnerd.handoff.pool import seed

            seed(pool, successor.state, successor.listener_socks, successor.relays)
        return pool
    from stunnerd.net.server import ServerOptions, TurnServer
    from stunnerd.offload.manager import OffloadManager
    from stunnerd.workers.local import LocalDataplane

    server = TurnServer(
        ServerOptions(
            bind_host=settings.bind_host,
            relay_addresses=settings.relay_address_list(),
            node_address=settings.node_address,
            tuning=settings.tuning,
            limits=settings.limits,
        ),
        offload=OffloadManager(),
        quota=make_quota(settings),
        nonce_key=successor.state.nonce_key if successor is not None else None,
        socket_source=successor.sockets.take if successor is not None else None,
    )
    if successor is not None:
        server.adopt(successor.state, successor.relays)
    return LocalDataplane(server)


async def take_over(settings: StunnerdSettings) -> Successor | None:
    """With `STUNNERD_HANDOFF_SOCKET`: the sockets and allocations of a stunnerd running there,
    or None when none runs; `ConfigExit` when it refuses or the handoff fails (it goes on)."""
    if not settings.handoff_socket:
        return None
    from stunnerd.handoff.local import successor_at
    from stunnerd.handoff.transport.channel import HandoffError

    workers = settings.udp_thread_num if settings.udp_thread_num > 1 else 0
    try:
        return await successor_at(Path(settings.handoff_socket), workers)
    except HandoffError as exc:
        raise ConfigExit(f"handoff from the running stunnerd failed, it serves on: {exc}") from exc


def make_quota(settings: StunnerdSettings) -> ClusterQuota | None:
    if settings.quota is None:
        return None
    from stunnerd.quota import ClusterQuota

    return ClusterQuota(
        settings.quota,
        f"{settings.namespace}/{settings.name}/{socket.gethostname()}-{os.getpid()}",
    )


class ManagedDataplane:
    """The running process: dataplane, admin servers, lifecycle and the reconciler."""

    def __init__(
        self,
        settings: StunnerdSettings,
        dataplane: Dataplane,
        handed: Sequence[NamedSocket] = (),
    ) -> None:
        self.settings = settings
        self.dataplane = dataplane
        self.lifecycle = Lifecycle(force_ready=settings.force_ready)
        self.admin = AdminServers(
            self.lifecycle,
            dataplane.stats,
            sources=StatusSources(
                revision=lambda: self.reconciler.revision,
                epoch=lambda: self.reconciler.epoch,
                config_counts=lambda: self.reconciler.counts(),
                listener_states=lambda: self.reconciler.listeners,
                apply_failures=lambda: self.reconciler.failures,
                last_rejection=lambda: self.reconciler.last_rejection,
                extra_status=self._extra_status,
            ),
            settings=settings.admin,
            log_override=settings.log_spec,
            refresh=dataplane.refresh,
            bind_host=settings.bind_host,
            handed=handed,
        )
        self.reconciler = Reconciler(dataplane, self.admin)
        self._retry = ListenerRetry(
            self.reconciler,
            Backoff(initial_s=settings.listener_retry_min_s, cap_s=settings.listener_retry_max_s),
            on_outcome=self._applied,
            stopped=lambda: self.lifecycle.draining,
        )
        self._follow: asyncio.Task[None] | None = None
        self._closed = False
        self._first_applied = asyncio.Event()

    def _extra_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"offload": self.dataplane.offload_status()}
        quota = self.dataplane.quota_status()
        if quota is not None:
            out["user_quota"] = quota
        workers = self.dataplane.worker_status()
        if workers is not None:
            out["workers"] = workers
        return out

    # ------------------------------------------------------------------ the first config

    async def serve(self) -> None:
        """Take the first config (a TURN URI's, or the origin's) and follow the origin where it
        is watched; raises `ConfigExit` when there is nothing to serve."""
        if self.settings.turn_uri is not None:
            await self._serve_uri(self.settings.turn_uri)
            return
        try:
            origin = make_origin(self.settings)
        except ConfigOriginError as exc:
            raise ConfigExit(str(exc)) from exc
        kind = parse_origin(self.settings.origin).kind
        if self.settings.watch or kind == "ws":
            await self._start_health()
        else:
            await self._load_once(origin)
        if self.settings.watch or kind in ("ws", "file"):
            origin.on_rejected = self.rejected
            self._follow = asyncio.create_task(self.follow(origin), name="stunnerd-config-watch")
            self._follow.add_done_callback(_log_unexpected_exit)

    async def _serve_uri(self, uri: str) -> None:
        try:
            config = default_config_from_uri(uri)
        except ConfigError as exc:
            raise ConfigExit(f"invalid TURN URI: {exc}") from exc
        if (await self.apply(config)).error is not None:
            raise ConfigExit("")  # the reconciler logged why
        self._check_health()

    async def _start_health(self) -> None:
        """Watch mode: /live answers before the first config names an endpoint."""
        try:
            await self.admin.start_health(self.settings.bootstrap_health_endpoint)
        except OSError as exc:
            # Probes would fail forever: better a clear exit than a silent pod.
            raise ConfigExit(str(self.admin.health_error)) from exc

    async def _load_once(self, origin: ConfigOrigin) -> None:
        try:
            event = await origin.load()
        except ConfigOriginError as exc:
            raise ConfigExit(str(exc)) from exc
        outcome = await self.apply(event.config, event.revision)
        if outcome.error is not None:
            raise ConfigExit(outcome.error)
        self._check_health()

    def _check_health(self) -> None:
        if self.admin.health_error:
            raise ConfigExit(self.admin.health_error)

    # ------------------------------------------------------------------ applying configs

    async def apply(
        self, config: StunnerConfig, revision: int | None = None, epoch: str | None = None
    ) -> ApplyOutcome:
        outcome = await self.reconciler.apply(config, revision=revision, epoch=epoch)
        self._applied(outcome)
        return outcome

    def _applied(self, outcome: ApplyOutcome) -> None:
        """After an apply or a retry: announce what came up, readiness, the next retry."""
        if outcome.error is None:
            self._first_applied.set()
        if outcome.error is None and not outcome.ignored:
            for name, port in outcome.started:
                # A stable line on stdout that scripts and tests wait for.
                print(f"stunnerd: listener {name} ready on port {port}", flush=True)
        if not self.lifecycle.draining:
            self.lifecycle.ready = self.reconciler.serving > 0
        self._retry.schedule()

    async def first_config(self, timeout_s: float) -> None:
        """Wait until a config applied (a watched origin's comes after `serve`), or ConfigExit."""
        try:
            await asyncio.wait_for(self._first_applied.wait(), timeout_s)
        except TimeoutError:
            raise ConfigExit(f"no config applied within {timeout_s:g} s") from None

    async def stop_retrying(self) -> None:
        await self._retry.stop()

    def rejected(self, reason: str, revision: int | None, epoch: str | None) -> None:
        """The origin refused a config as a whole (invalid): counted, reason in /status."""
        self.reconciler.reject(reason, revision=revision, epoch=epoch)

    async def follow(self, origin: ConfigOrigin) -> None:
        async for event in origin.watch():
            if self.lifecycle.draining:
                return
            try:
                await self.apply(event.config, event.revision, event.epoch)
            except Exception as exc:
                # Never let one bad apply end the watch: the running config stays in force.
                self.reconciler.reject(f"applying the config failed unexpectedly: {exc!r}")
                log.exception("applying a config failed unexpectedly")

    # ------------------------------------------------------------------ the end

    async def drain(self, first: int, signals: asyncio.Queue[int]) -> None:
        """After the first signal: stop following, then drain within the grace period (shorter
        for SIGINT); a second signal ends the wait at once."""
        log.info("%s received: draining", signal.Signals(first).name)
        await _cancel(self._follow)
        await self.stop_retrying()
        grace = self.settings.grace_period_s
        if first == signal.SIGINT:
            grace = min(grace, self.settings.sigint_grace_period_s)
        abort = asyncio.Event()
        second = asyncio.create_task(_second_signal(signals, abort), name="stunnerd-abort")
        try:
            await drain(
                self.lifecycle,
                allocations=self.dataplane.allocations,
                stop_accepting=self.dataplane.stop_accepting,
                grace_period_s=grace,
                abort=abort,
                check_interval_s=self.settings.drain_check_interval_s,
            )
        finally:
            await _cancel(second)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await _cancel(self._follow)
        await self.stop_retrying()
        await self.admin.close()
        await self.dataplane.close()


async def dry_run(settings: StunnerdSettings) -> int:
    """`--dry-run` (upstream's flag): load the config once and check it as an apply would,
    listeners included (addresses, TLS material), without binding a socket."""
    from stunnerd.net.server import ListenerError, ServerOptions, TurnServer

    try:
        if settings.turn_uri is not None:
            config = default_config_from_uri(settings.turn_uri)
        else:
            config = (await make_origin(settings).load()).config
        server = TurnServer(
            ServerOptions(
                bind_host=settings.bind_host,
                relay_addresses=settings.relay_address_list(),
                node_address=settings.node_address,
            )
        )
        for listener in config.listeners:
            server.check_listener(listener)
    except (ConfigOriginError, ConfigError, ListenerError, ValueError) as exc:
        print(f"stunnerd: dry run: config not valid: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(
        f"stunnerd: dry run: config {config.admin.name} is valid: "
        f"{len(config.listeners)} listener(s), {len(config.clusters)} cluster(s)",
        flush=True,
    )
    return EXIT_OK


async def run(settings: StunnerdSettings) -> int:
    try:
        successor = await take_over(settings)
    except ConfigExit as exc:
        print(f"stunnerd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    dataplane = make_dataplane(settings, successor)
    app = ManagedDataplane(settings, dataplane, successor.admin if successor is not None else ())
    handoff: HandoffServer | None = None
    try:
        with _signal_queue() as signals, successor_on_sigusr2(settings):
            await dataplane.start()
            await _serve_first(app, successor)
            handoff = await serve_handoff(settings, dataplane, app.admin.listening)
            first = await signal_or_handoff(signals, handoff)
            if first is not None:
                await app.drain(first, signals)
            else:
                await app.admin.let_go()
                if settings.handoff_idle:
                    await idle(app.close, handoff, signals)
                else:
                    log.info("handoff: exiting")
    except ConfigExit as exc:
        if str(exc):
            print(f"stunnerd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    finally:
        if handoff is not None:
            await handoff.close()
        await app.close()
    return EXIT_OK


async def _serve_first(app: ManagedDataplane, successor: Successor | None) -> None:
    """The first config; a process that took over answers the old one how it went."""
    try:
        await app.serve()
        if successor is not None:
            await app.first_config(FIRST_CONFIG_TIMEOUT_S)
    except BaseException as exc:
        if successor is not None:
            successor.refuse(str(exc) or "the first config did not apply")
        raise
    if successor is not None:
        successor.confirm()
        app.admin.release_handed()


@contextlib.contextmanager
def _signal_queue() -> Iterator[asyncio.Queue[int]]:
    """SIGTERM and SIGINT, queued while the block runs."""
    loop = asyncio.get_running_loop()
    signals: asyncio.Queue[int] = asyncio.Queue()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    try:
        yield signals
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _second_signal(signals: asyncio.Queue[int], abort: asyncio.Event) -> None:
    sig = await signals.get()
    log.warning("%s received again: exiting now", signal.Signals(sig).name)
    abort.set()


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("task %s failed: %r", task.get_name(), exc, exc_info=exc)
    else:
        log.error("task %s ended unexpectedly", task.get_name())
