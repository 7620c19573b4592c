"""N worker processes behind one stunnerd: configs fan out, counters are summed.

Python runs one core per process, so `--udp-thread-num N` starts N workers, each with its own
TURN server. The supervisor binds every listener's SO_REUSEPORT group itself, one socket per
worker, before any worker serves it, and hands each worker its member (`sockets`); the kernel
spreads clients over the workers by 5-tuple hash, and since the group never changes while the
listener stays configured, a client always lands on the same worker, whatever workers start, die
or restart. A config is applied to every worker; if any worker fails, the workers that took it are
sent the previous config again, so they never disagree for longer than one apply. A worker that
dies is restarted with the config in force and the TURN-UDP allocations it journaled here
(`journal`), which it adopts before it reads: its clients carry on. Counters come from a `stats`
request to each worker.

A dead worker's last snapshot must not stand in for its replacement: until the new process has
taken the config and answered a `stats` request, it reports nothing (no listeners, no
connections), so `/status` never shows a listener as served by a worker that has not bound it
yet. The dead worker's packet and byte counts are kept aside and still summed, so the traffic
counters do not go back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from stunner_common.config import StunnerConfig
from stunner_common.contracts.worker_messages import (
    ApplyReply,
    ApplyRequest,
    DoneReply,
    DrainRequest,
    StatsReply,
    StatsRequest,
)
from stunner_common.logs import LogFormat
from stunnerd.net.guard import ClientLimits
from stunnerd.net.tuning import ServerTuning
from stunnerd.offload.manager import OffloadManager
from stunnerd.quota import QuotaSettings
from stunnerd.reconcile.listeners import failure_cause
from stunnerd.status import (
    ApplyOutcome,
    ClusterStats,
    ListenerState,
    ListenerStats,
    StatsSnapshot,
    merge_snapshots,
)
from stunnerd.workers.sockets import (
    SocketGroups,
    config_keys,
    listener_key,
    new_nonce_key,
    send_offload,
    send_relays,
    send_sockets,
)
from stunnerd.workers.timeouts import WorkerTimeouts
from stunnerd.workers.worker import (
    DEFAULT_TIMEOUTS,
    DEFAULT_TUNING,
    Worker,
    WorkerError,
)

__all__ = ["Worker", "WorkerError", "WorkerPool", "WorkerTimeouts"]

log = logging.getLogger(__name__)


class WorkerPool:
    """The `Dataplane` of a multi-process stunnerd."""

    def __init__(
        self,
        count: int,
        *,
        bind_host: str = "0.0.0.0",
        log_spec: str | None = None,
        log_format: LogFormat = "text",
        tuning: ServerTuning = DEFAULT_TUNING,
        timeouts: WorkerTimeouts = DEFAULT_TIMEOUTS,
        limits: ClientLimits | None = None,
        relay_addresses: tuple[str, ...] = (),
        quota: QuotaSettings | None = None,
        node_address: str = "",
        nonce_key: bytes | None = None,
        journal: bool = True,
        libbpf: str = "",
    ) -> None:
        if count < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.timeouts = timeouts
        self.bind_host = bind_host
        self.node_address = node_address
        self.nonce_key = nonce_key if nonce_key is not None else new_nonce_key()
        self.sockets = SocketGroups(count)
        self.workers = [
            Worker(
                i,
                bind_host,
                log_spec,
                log_format=log_format,
                tuning=tuning,
                stop_timeout_s=timeouts.stop_s,
                limits=limits,
                nonce_key=self.nonce_key,
                relay_addresses=relay_addresses,
                quota=quota,
                node_address=node_address,
                journal=journal,
                libbpf=libbpf,
            )
            for i in range(count)
        ]
        self.retired = StatsSnapshot()  # traffic counted by workers that have since died
        # The kernel offload: loaded and attached here, once; each worker writes the entries
        # of its own channels into these maps (`sockets.send_offload`, `SharedMaps`).
        self.offload = OffloadManager()
        self.retired_offload = [0, 0]  # packets, bytes the kernel relayed for dead workers
        self.running: StunnerConfig | None = None
        self.unbound: dict[str, ListenerState] = {}
        """Listeners of `running` whose socket group could not be bound (left out, retrying)."""
        self._lock = asyncio.Lock()
        self._watchdog: asyncio.Task[None] | None = None
        self._closing = False
        self.draining = False

    async def start(self) -> None:
        await asyncio.gather(*(w.start() for w in self.workers))
        self._watchdog = asyncio.create_task(self._watch(), name="stunnerd-worker-watchdog")

    async def _watch(self) -> None:
        """Restart a worker that died, and give it the config in force."""
        while not self._closing:
            waits = [asyncio.create_task(w.exited.wait()) for w in self.workers]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in waits:
                    t.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            for worker in self.workers:
                if worker.exited.is_set() and not self._closing:
                    log.error("worker %d (pid %s) exited; restarting it", worker.index, worker.pid)
                    self._retire(worker)
                    try:
                        await self._restart(worker)
                    except Exception:  # the watchdog must outlive any one restart
                        log.exception("worker %d: restart failed; trying again", worker.index)
                        worker.exited.set()
                        await asyncio.sleep(self.timeouts.restart_delay_s)

    async def _restart(self, worker: Worker) -> None:
        """Start a dead worker again; it carries on the allocations it journaled (`journal`).

        The kernel offload keeps relaying their channels meanwhile: the new incarnation writes
        its entries under a new owner tag, and the old tag's leftovers (channels of allocations
        that expired while no worker ran) are removed once it has.
        """
        await worker.stop()
        old_owner, worker.owner = worker.owner, worker.owner + len(self.workers)
        await asyncio.sleep(self.timeouts.restart_delay_s)
        await worker.start()
        async with self._lock:
            running = self._bound(self.running)
            if running is not None:
                await self._apply_one(worker, running)
            else:
                worker.journal.close()
            if self.draining:
                await worker.request(DrainRequest(), DoneReply, self.timeouts.request_s)
        if self.offload.datapath is not None:
            gone = self.offload.datapath.forget_owner(old_owner)
            log.info("offload: removed %d kernel entries of worker %d", gone, worker.index)

    async def _apply_one(self, worker: Worker, config: StunnerConfig) -> ApplyReply:
        """Give `worker` the config with its sockets; the first config of a (re)started worker
        also carries the allocations journaled before (by its dead predecessor, or handed over
        by the stunnerd this one took over from) and their relay sockets."""
        keys = sorted(config_keys(config, self.bind_host, self.node_address))
        adopt: str | None = None
        try:
            if worker.channel is None:
                raise WorkerError(f"worker {worker.index} is not running")
            try:
                send_sockets(worker.channel, self.sockets.of_worker(worker.index, keys))
                if worker.fresh:
                    names = (lst.name for lst in config.listeners)
                    adopt, relays = worker.journal.handover(names, self.nonce_key)
                    send_relays(worker.channel, relays)
                    worker.fresh = False
                datapath = self.offload.datapath
                send_offload(
                    worker.channel,
                    datapath.map_fds() if datapath is not None else None,
                    dict(self.offload.modes),
                    worker.owner,
                    str(self.offload.status().get("reason", "")),
                )
            except OSError as exc:
                raise WorkerError(f"worker {worker.index}: sockets not handed over: {exc}") from exc
            message = ApplyRequest(config.canonical_json(), tuple(keys), adopt)
            return await worker.request(message, ApplyReply, self.timeouts.request_s)
        except WorkerError as exc:
            return ApplyReply(error=str(exc))

    async def apply(self, config: StunnerConfig) -> ApplyOutcome:
        async with self._lock:
            if self.draining:
                return ApplyOutcome(applied=False, ignored=True)
            # Listener by listener: one whose socket group cannot be bound is left out of what
            # the workers get (and retried at the next apply); the others apply.
            unbound: dict[str, ListenerState] = {}
            for lst in config.listeners:
                key = listener_key(lst, self.bind_host, self.node_address)
                try:
                    self.sockets.bind((key,))
                except OSError as exc:
                    cause, _ = failure_cause(exc)
                    before = self.unbound.get(lst.name)
                    attempts = before.attempts + 1 if before is not None else 1
                    unbound[lst.name] = ListenerState(
                        lst.name, "retrying", f"listener {lst.name}: {exc}", cause, attempts
                    )
            self.unbound = unbound
            self._configure_offload(config)
            try:
                return await self._apply_all(config)
            finally:
                self.sockets.retain(
                    config_keys(self._bound(self.running), self.bind_host, self.node_address)
                )

    def _bound(self, config: StunnerConfig | None) -> StunnerConfig | None:
        """`config` without the listeners whose sockets could not be bound."""
        if config is None or not self.unbound:
            return config
        kept = tuple(lst for lst in config.listeners if lst.name not in self.unbound)
        return config.model_copy(update={"listeners": kept})

    async def _apply_all(self, desired: StunnerConfig) -> ApplyOutcome:
        config = self._bound(desired)
        assert config is not None
        replies = await asyncio.gather(*(self._apply_one(w, config) for w in self.workers))
        errors = [f"worker {i}: {r.error}" for i, r in enumerate(replies) if r.error]
        if errors:
            self._configure_offload(self.running)
            previous = self._bound(self.running)
            if previous is not None:
                took = [w for w, r in zip(self.workers, replies, strict=True) if not r.error]
                await asyncio.gather(*(self._apply_one(w, previous) for w in took))
            return ApplyOutcome(applied=False, error="; ".join(errors))
        if all(r.ignored for r in replies):
            return ApplyOutcome(applied=False, ignored=True)
        self.running = desired
        first = replies[0]
        return ApplyOutcome(
            applied=True,
            restarted=first.restarted,
            duration_s=max(r.duration_s for r in replies),
            started=first.started,
            listeners=self._merge_states(desired, replies),
        )

    def _merge_states(
        self, config: StunnerConfig, replies: list[ApplyReply]
    ) -> tuple[ListenerState, ...]:
        """A listener serves when every worker serves it; else the first worker's failure."""
        by_worker = [
            {s.name: s for s in map(ListenerState.from_json, r.listeners)} for r in replies
        ]
        out: list[ListenerState] = []
        for lst in sorted(config.listeners, key=lambda item: item.name):
            if lst.name in self.unbound:
                out.append(self.unbound[lst.name])
                continue
            states = [w.get(lst.name, ListenerState(lst.name, "rejected")) for w in by_worker]
            failed = [s for s in states if s.state != "serving"]
            out.append(failed[0] if failed else states[0])
        return tuple(out)

    def _configure_offload(self, config: StunnerConfig | None) -> None:
        if config is None:
            self.offload.configure("None")
        else:
            self.offload.configure(config.admin.offload_engine, config.admin.offload_interfaces)

    def offload_status(self) -> dict[str, Any]:
        """`/status`'s `offload`: the supervisor's program, the workers' channels and counts."""
        out = self.offload.status()
        if out["active"]:
            out["channels"] = sum(int(w.offload.get("channels", 0)) for w in self.workers)
            for i, key in enumerate(("packets", "bytes")):
                live = sum(int(w.offload.get(key, 0)) for w in self.workers)
                out[key] = live + self.retired_offload[i]
        return out

    def _retire(self, worker: Worker) -> None:
        """Forget a dead worker's gauges; keep its traffic and limit refusals in `retired`."""
        gone = worker.stats
        worker.stats = StatsSnapshot()
        for i, key in enumerate(("packets", "bytes")):
            self.retired_offload[i] += int(worker.offload.get(key, 0))
        worker.offload = {}
        traffic_only = StatsSnapshot(
            tuple(
                ListenerStats(x.name, traffic=x.traffic, limit_refusals=x.limit_refusals)
                for x in gone.listeners
            ),
            tuple(ClusterStats(c.name, c.traffic) for c in gone.clusters),
        )
        self.retired = merge_snapshots((self.retired, traffic_only))

    def stats(self) -> StatsSnapshot:
        live = [w.stats for w in self.workers]
        merged = merge_snapshots((*live, self.retired))
        serving = {x.name for snap in live for x in snap.listeners}
        return StatsSnapshot(
            tuple(x for x in merged.listeners if x.name in serving),
            merged.clusters,
            all(snap.traffic_measured for snap in live),
        )

    def quota_status(self) -> dict[str, Any] | None:
        """The cluster-wide user quota across the workers (from the last refresh): each counts
        in Redis on its own, so one that fell back to its local share makes the whole
        ``local-share``; None when the quota counts per process."""
        states = [w.quota for w in self.workers if w.quota is not None]
        if not states:
            return None
        fallen = [s for s in states if s.get("mode") != "cluster"]
        out = dict(fallen[0] if fallen else states[0])
        out["workers"] = [
            {"index": w.index, "mode": (w.quota or {}).get("mode")} for w in self.workers
        ]
        return out

    def worker_status(self) -> list[dict[str, Any]]:
        """Per-worker process ids, allocation and listener counts (from the last refresh), and
        the allocations the supervisor holds in its journal."""
        return [
            {
                "index": w.index,
                "pid": w.pid,
                "allocations": w.stats.allocations,
                "journaled": len(w.journal),  # what its replacement would carry on
                "listeners": len(w.stats.listeners),
            }
            for w in self.workers
        ]

    async def refresh(self) -> None:
        async def one(worker: Worker) -> None:
            try:
                reply = await worker.request(StatsRequest(), StatsReply, self.timeouts.stats_s)
            except WorkerError as exc:
                log.warning("%s", exc)
                return
            if worker.exited.is_set():
                return  # the answer of a process that is gone (the watchdog retires it)
            worker.stats = StatsSnapshot.from_dict(dict(reply.stats))
            worker.offload = dict(reply.offload)
            worker.quota = dict(reply.user_quota) if reply.user_quota is not None else None

        await asyncio.gather(*(one(w) for w in self.workers))

    async def allocations(self) -> int:
        await self.refresh()
        return self.stats().allocations

    async def stop_accepting(self) -> None:
        self.draining = True
        async with self._lock:
            for worker in self.workers:
                try:
                    await worker.request(DrainRequest(), DoneReply, self.timeouts.request_s)
                except WorkerError as exc:
                    log.warning("%s", exc)

    async def close(self) -> None:
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        await asyncio.gather(*(w.stop() for w in self.workers))
        for worker in self.workers:
            worker.journal.close()
        self.sockets.close()
        self.offload.close()  # detach: nothing is relayed in the kernel without the workers
