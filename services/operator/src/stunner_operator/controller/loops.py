"""Kubernetes mode: watch the cluster, render, publish configs, write statuses and dataplanes.

One task per watched resource lists it and then follows its watch (re-listing when the watch's
resourceVersion is gone, backing off on errors); events land in one queue. The render loop takes
events in batches (a short throttle window), applies them to the incremental renderer, and hands
the results to two writers that never block rendering: the Redis publisher (the whole config set
with ``replace_all``) and the Kubernetes writer (statuses, Service and Deployment applies,
deletes), which coalesces writes per object and retries failed ones. Nothing is rendered before
every resource has been listed once, so a restart never publishes a half-seen cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from stunner_common.crds import CrdError, K8sObject, UnsupportedKindError, parse_object
from stunner_common.io.kube.api import GoneError, KubeApi, KubeApiError, NotFoundError
from stunner_operator.k8s.resources import (
    BY_KIND,
    WATCHED,
    WRITABLE,
    Resource,
    missing_crd_message,
)
from stunner_operator.observe import OperatorMetrics
from stunner_operator.publish import ConfigSink as BaseSink
from stunner_operator.publish import PublishError, publish_configs
from stunner_operator.render.dataplane import node_addresses
from stunner_operator.render.engine import RenderDelta, Renderer
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.status import Status
from stunner_operator.render.store import ObjKey, key_of

log = logging.getLogger(__name__)

# Fields that change on every write and mean nothing to the renderer; dropping them keeps our
# own status writes from echoing back as changes.
_KEEP_STATUS = frozenset({"Service", "Node"})


class ConfigSink(BaseSink, Protocol):
    async def publish_node_addresses(self, addresses: Mapping[str, str]) -> bool: ...


@dataclass(frozen=True, slots=True)
class _Event:
    kind: str
    upserts: tuple[K8sObject, ...] = ()
    deletes: tuple[ObjKey, ...] = ()


@dataclass(frozen=True, slots=True)
class _Write:
    """One pending write: a status patch, an apply, or a delete (``body is None``)."""

    action: str  # "status" | "apply" | "delete"
    key: ObjKey
    body: Mapping[str, Any] | None


def _label(key: ObjKey) -> str:
    return f"{key[0]} {key[1]}/{key[2]}" if key[1] else f"{key[0]} {key[2]}"


def _clean(raw: dict[str, Any], kind: str) -> dict[str, Any]:
    doc = dict(raw)
    meta = dict(doc.get("metadata") or {})
    meta.pop("managedFields", None)
    meta.pop("resourceVersion", None)
    doc["metadata"] = meta
    if kind not in _KEEP_STATUS:
        doc.pop("status", None)
    return doc


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """What the Kubernetes controller is told by the operator's settings; ``__main__`` builds it
    once (``OPERATOR_THROTTLE_S``, ``OPERATOR_PUBLISH_RETRY_S``, ``OPERATOR_WATCH_TIMEOUT_S``,
    ``--enforce-reference-grants`` and the render options)."""

    render: RenderOptions = field(default_factory=RenderOptions)
    throttle_s: float = 0.05
    """How long the render loop gathers events into one batch."""
    retry_s: float = 1.0
    """Delay before a failed list, publish or write is tried again."""
    resync_check_s: float = 1.0
    """Bound on the Redis check that the published configs are still there."""
    watch_timeout_s: int = 300
    """How long one watch request lasts before it is renewed from the last resource version."""
    resources: tuple[Resource, ...] = WATCHED
    """The resources listed and watched (`stunner_operator.k8s.resources.watched`)."""
    writers: int = 8
    """Writes to the API server in flight at once, each to another object: one at a time, a
    thousand Gateways' Services, Deployments and statuses queue behind each other for minutes
    (every write waits for etcd), and a Gateway added meanwhile waits for all of them."""


class KubeController:
    def __init__(
        self,
        api: KubeApi,
        sink: ConfigSink,
        options: ControllerOptions = ControllerOptions(),
        *,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.renderer = Renderer(options.render)
        self.metrics = metrics or OperatorMetrics()
        self._api = api
        self._sink = sink
        self._throttle_s = options.throttle_s
        self._retry_s = options.retry_s
        self._resync_check_s = options.resync_check_s
        self._watch_timeout_s = options.watch_timeout_s
        self._writers = max(1, options.writers)
        self._resources = resources = options.resources
        self._events: asyncio.Queue[_Event] = asyncio.Queue()
        self._known: dict[str, set[ObjKey]] = {r.kind: set() for r in resources}
        self._served: dict[str, Resource] = {}
        self._missing: set[str] = set()
        """The version of each kind the cluster serves (where a fallback was needed)."""
        self._listed: set[str] = set()
        self.synced = asyncio.Event()
        """Set once every resource was listed and the first render ran."""
        self._all_listed = asyncio.Event()
        self._publish_wake = asyncio.Event()
        self._write_wake = asyncio.Event()
        self._writes: dict[tuple[str, ObjKey], _Write] = {}
        self._writing: set[tuple[str, ObjKey]] = set()
        """Slots with a write in flight: a newer intent for one waits until it is done."""
        self._transitions: dict[tuple[ObjKey, str], tuple[str, str]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; every task is owned and ends with this call."""
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(self._watch_loop(res), name=f"watch-{res.kind}")
                for res in self._resources
            ]
            tasks.append(tg.create_task(self._render_loop(), name="operator-render"))
            tasks.append(tg.create_task(self._publish_loop(), name="operator-publish"))
            tasks += [
                tg.create_task(self._write_loop(), name=f"operator-k8s-writer-{i}")
                for i in range(self._writers)
            ]
            await stop.wait()
            for task in tasks:
                task.cancel()

    # -- watching -------------------------------------------------------------------------

    def _parse(self, res: Resource, raw: dict[str, Any]) -> K8sObject | None:
        try:
            return parse_object(_clean(raw, res.kind))
        except UnsupportedKindError:
            return None
        except CrdError as err:
            log.warning("ignoring invalid %s: %s", res.kind, err)
            return None

    def _mark_listed(self, kind: str) -> None:
        self._listed.add(kind)
        if self._listed >= {r.kind for r in self._resources}:
            self._all_listed.set()

    async def _watch_loop(self, res: Resource) -> None:
        while (listed := await self._list(res)) is not None:
            res, version = listed
            await self._follow(res, version)

    async def _list(self, res: Resource) -> tuple[Resource, str] | None:
        """List ``res`` (or its fallback) until that works and queue what it holds; returns the
        resource served and the version to watch from, or None for an optional resource the
        cluster does not serve."""
        while True:
            try:
                items, version = await self._api.list(res)
            except NotFoundError:
                if res.fallback is not None:
                    log.info(
                        "%s is not served by this cluster; watching %s instead",
                        res.list_path(),
                        res.fallback.list_path(),
                    )
                    res = res.fallback
                    continue
                if res.optional:
                    log.info("%s is not served by this cluster; not watching it", res.list_path())
                    self._mark_listed(res.kind)
                    return None
                if res.kind not in self._missing:
                    self._missing.add(res.kind)
                    log.error("%s; retrying until it is installed", missing_crd_message(res))
                await asyncio.sleep(self._retry_s)
                continue
            except KubeApiError as err:
                log.warning("listing %s failed: %s; retrying", res.list_path(), err)
                await asyncio.sleep(self._retry_s)
                continue
            self._served[res.kind] = res
            objs = [o for raw in items if (o := self._parse(res, raw)) is not None]
            keys = {key_of(o) for o in objs}
            gone = tuple(sorted(self._known[res.kind] - keys))
            self._known[res.kind] = keys
            await self._events.put(_Event(res.kind, tuple(objs), gone))
            self._mark_listed(res.kind)
            return res, version

    async def _follow(self, res: Resource, version: str) -> None:
        """Watch ``res`` from ``version`` until the watch expires or fails (then list again)."""
        try:
            while True:
                async for etype, raw in self._api.watch(
                    res, version, timeout_s=self._watch_timeout_s
                ):
                    version = str((raw.get("metadata") or {}).get("resourceVersion") or version)
                    if etype != "BOOKMARK":
                        await self._watched(res, etype, raw)
        except GoneError:
            self.metrics.watch_restarts.labels(resource=res.kind).inc()
            log.info("watch of %s expired; listing again", res.list_path())
        except KubeApiError as err:
            self.metrics.watch_restarts.labels(resource=res.kind).inc()
            log.warning("watch of %s failed: %s; listing again", res.list_path(), err)
            await asyncio.sleep(self._retry_s)

    async def _watched(self, res: Resource, etype: str, raw: dict[str, Any]) -> None:
        """Queue one watch event (an object added, modified or deleted)."""
        obj = self._parse(res, raw)
        if obj is None:
            return
        key = key_of(obj)
        if etype == "DELETED":
            self._known[res.kind].discard(key)
            await self._events.put(_Event(res.kind, deletes=(key,)))
        else:
            self._known[res.kind].add(key)
            await self._events.put(_Event(res.kind, upserts=(obj,)))

    # -- rendering ------------------------------------------------------------------------

    async def _next_batch(self) -> list[_Event]:
        batch = [await self._events.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._throttle_s
        while (left := deadline - loop.time()) > 0:
            try:
                async with asyncio.timeout(left):
                    batch.append(await self._events.get())
            except TimeoutError:
                break
        while not self._events.empty():
            batch.append(self._events.get_nowait())
        return batch

    async def _render_loop(self) -> None:
        await self._all_listed.wait()
        while True:
            batch = await self._next_batch()
            changes: dict[ObjKey, K8sObject | None] = {}
            for event in batch:
                for obj in event.upserts:
                    changes[key_of(obj)] = obj
                for key in event.deletes:
                    changes[key] = None
            store = self.renderer.store
            # Re-lists and fresh watches repeat objects we have: only real changes count.
            changes = {k: o for k, o in changes.items() if store.get_key(k) != o}
            if not changes and self.synced.is_set():
                continue
            with self.metrics.loop("render"):
                started = time.perf_counter()
                try:
                    delta = self.renderer.apply(
                        [o for o in changes.values() if o is not None],
                        [k for k, o in changes.items() if o is None],
                    )
                    self.metrics.observe_render(
                        time.perf_counter() - started, store, len(self.renderer.configs())
                    )
                except Exception:
                    log.exception("render failed; nothing is written for this batch")
                    continue
                self._handle(delta)
                self.synced.set()

    def _handle(self, delta: RenderDelta) -> None:
        for key in sorted(delta.statuses):
            status = delta.statuses[key]
            if status is None:
                continue
            log.info("%s: %s", _label(key), status.summary())
            render = self.renderer.gateway(key[1], key[2]) if key[0] == "Gateway" else None
            for warning in render.warnings if render is not None else ():
                log.warning("%s: %s", _label(key), warning)
            self._queue(_Write("status", key, self._stamp(key, status)))
        for cid in sorted(delta.deleted):
            log.info("config %s removed", cid)
        for key in sorted(delta.resource_deletes):
            self._queue(_Write("delete", key, None))
        for kind, manifests in (("Service", delta.services), ("Deployment", delta.deployments)):
            for cid, manifest in sorted(manifests.items()):
                if manifest is not None:
                    ns, _, name = cid.partition("/")
                    self._queue(_Write("apply", (manifest.get("kind", kind), ns, name), manifest))
        if delta.configs_changed or not self.synced.is_set():
            self._publish_wake.set()

    def _queue(self, write: _Write) -> None:
        slot = ("status" if write.action == "status" else "object", write.key)
        self._writes.pop(slot, None)  # re-insert: the newest intent goes last
        self._writes[slot] = write
        self._write_wake.set()

    def _stamp(self, key: ObjKey, status: Status) -> dict[str, Any]:
        """The status as Kubernetes JSON, with lastTransitionTime kept while a condition holds."""
        body = status.to_k8s()
        now = _now()

        def walk(conditions: list[dict[str, Any]], scope: str) -> None:
            for cond in conditions:
                slot = (key, f"{scope}/{cond['type']}")
                old = self._transitions.get(slot)
                if old is None or old[0] != cond["status"]:
                    old = (cond["status"], now)
                    self._transitions[slot] = old
                cond["lastTransitionTime"] = old[1]

        walk(body.get("conditions", []), "")
        for listener in body.get("listeners", []):
            walk(listener["conditions"], f"listener:{listener['name']}")
        for parent in body.get("parents", []):
            walk(parent["conditions"], "parent:" + json.dumps(parent["parentRef"], sort_keys=True))
        return body

    # -- writers --------------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._resync_check_s):
                    await self._publish_wake.wait()
            except TimeoutError:
                # Redis restarted without its data (or was flushed): publish everything again.
                if self.synced.is_set() and await self._sink.store_lost():
                    log.warning("Redis lost the published configs: publishing them all again")
                else:
                    await self._publish_node_addresses()
                    continue
            self._publish_wake.clear()
            try:
                await publish_configs(self._sink, self.renderer.configs(), self.metrics)
            except PublishError as err:
                log.warning("publishing to Redis failed, retrying in %.1fs: %s", self._retry_s, err)
                await asyncio.sleep(self._retry_s)
                self._publish_wake.set()
                continue
            await self._publish_node_addresses()

    async def _publish_node_addresses(self) -> None:
        """Relay address discovery: the Nodes' external addresses, for the CDS (if changed)."""
        if not self.synced.is_set():
            return
        try:
            await self._sink.publish_node_addresses(node_addresses(self.renderer.store.nodes()))
        except PublishError as err:
            log.warning("publishing the node addresses to Redis failed: %s", err)

    def _next_write(self) -> tuple[tuple[str, ObjKey], _Write] | None:
        """The oldest intent whose object has no write in flight, taken off the queue."""
        slot = next((s for s in self._writes if s not in self._writing), None)
        if slot is None:
            return None
        self._writing.add(slot)
        return slot, self._writes.pop(slot)

    async def _write_loop(self) -> None:
        """One of ``writers`` loops: writes the queued intents, oldest first, never two for the
        same object at once (the newest intent for an object replaces an older queued one)."""
        loop = asyncio.get_running_loop()
        while True:
            taken = self._next_write()
            if taken is None:
                self._write_wake.clear()
                await self._write_wake.wait()
                continue
            slot, write = taken
            try:
                with self.metrics.loop("write"):
                    await self._perform(write)
            except KubeApiError as err:
                self.metrics.write_errors.inc()
                if err.status == 422:
                    # The API server refuses the object itself (e.g. a Gateway address in a
                    # range Services may not use): the same body would fail forever. The next
                    # render that changes it is written again.
                    log.error("the API server refused %s: %s", _label(write.key), err)
                else:
                    log.warning("writing %s failed: %s", _label(write.key), err)
                    loop.call_later(self._retry_s, self._retry, slot, write)
            finally:
                self._writing.discard(slot)
                if slot in self._writes:  # a newer intent came while this one was written
                    self._write_wake.set()

    def _retry(self, slot: tuple[str, ObjKey], write: _Write) -> None:
        self._writes.setdefault(slot, write)  # unless a newer intent replaced it
        self._write_wake.set()

    async def _perform(self, write: _Write) -> None:
        kind, ns, name = write.key
        if write.action == "status":
            assert write.body is not None
            with contextlib.suppress(NotFoundError):  # the object was deleted meanwhile
                await self._api.patch_status(
                    self._served.get(kind, BY_KIND[kind]), ns, name, write.body
                )
        elif write.action == "apply":
            assert write.body is not None
            await self._api.apply(WRITABLE[kind], write.body)
        elif await self._api.delete(WRITABLE[kind], ns, name):
            log.info("deleted %s", _label(write.key))
