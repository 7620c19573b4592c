"""Local mode: render a folder of Gateway API YAML into Redis and keep it in step with the folder.

One task watches the folder (``watchfiles``) and re-renders on every change; only the objects
that changed reach the renderer, so only the Gateways they affect are rendered again. Another
task publishes the full config set whenever it changed, retrying while Redis is away: rendering
never waits for Redis. Status changes are logged as one line per object, since there is no API
server to write them to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from watchfiles import awatch

from stunner_common.config import StunnerConfig
from stunner_common.crds import K8sObject
from stunner_common.store import PublishResult
from stunner_operator.manifests.loader import ManifestSet
from stunner_operator.observe import OperatorMetrics
from stunner_operator.publish import PublishError
from stunner_operator.render.engine import RenderDelta, Renderer
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.store import ObjKey

log = logging.getLogger(__name__)


class ConfigSink(Protocol):
    async def publish(self, configs: Mapping[str, StunnerConfig]) -> PublishResult: ...

    async def store_lost(self) -> bool: ...


def _object_label(key: ObjKey) -> str:
    kind = "UDPRoute (gateway.networking.k8s.io/v1alpha2)" if key[0] == "UDPRouteV1A2" else key[0]
    return f"{kind} {key[1]}/{key[2]}" if key[1] else f"{kind} {key[2]}"


class LocalOperator:
    """Owns the renderer for one folder; ``sync`` is the pure-ish step, ``run`` the loop."""

    def __init__(
        self,
        root: Path,
        sink: ConfigSink | None,
        *,
        options: RenderOptions | None = None,
        debounce_ms: int = 50,
        retry_s: float = 1.0,
        resync_check_s: float = 1.0,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.root = root
        self.metrics = metrics or OperatorMetrics()
        self.renderer = Renderer(options)
        self.manifests = ManifestSet(root)
        self._sink = sink
        self._applied: dict[ObjKey, K8sObject] = {}
        self._debounce_ms = debounce_ms
        self._retry_s = retry_s
        self._resync_check_s = resync_check_s
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()

    def sync(self) -> RenderDelta:
        """Re-read the folder, render what changed, log errors and status changes."""
        result = self.manifests.reload()
        for skipped in result.skipped:
            log.info("skipping %s", skipped)
        for err in result.new_errors:
            log.error("%s (keeping the last good version of this file)", err)
        desired = result.objects
        upserts = [obj for key, obj in desired.items() if self._applied.get(key) != obj]
        deletes = [key for key in self._applied if key not in desired]
        self._applied = dict(desired)
        started = time.perf_counter()
        delta = self.renderer.apply(upserts, deletes)
        self.metrics.observe_render(
            time.perf_counter() - started, self.renderer.store, len(self.renderer.configs())
        )
        self.metrics.manifest_errors.set(len(self.manifests.errors))
        gone = set(deletes)
        for key in sorted(delta.statuses):
            status = delta.statuses[key]
            if key in gone:
                log.info("%s: deleted", _object_label(key))
            elif status is None:
                log.info("%s: no status (not managed by this operator)", _object_label(key))
            else:
                log.info("%s: %s", _object_label(key), status.summary())
                self._log_warnings(key)
        for cid in sorted(delta.deleted):
            log.info("config %s removed", cid)
        if delta.configs_changed:
            self._wake.set()
        return delta

    def _log_warnings(self, key: ObjKey) -> None:
        if key[0] != "Gateway":
            return
        render = self.renderer.gateway(key[1], key[2])
        for warning in render.warnings if render is not None else ():
            log.warning("%s: %s", _object_label(key), warning)

    def _safe_sync(self) -> None:
        # A failed render must not stop the operator: the published configs stay as they were
        # and the next change in the folder gets a fresh try.
        try:
            self.sync()
        except Exception:
            log.exception("rendering %s failed; the published configs are unchanged", self.root)

    async def publish_once(self) -> PublishResult | None:
        if self._sink is None:
            return None
        configs = self.renderer.configs()
        try:
            result = await self._sink.publish(configs)
        except PublishError as err:
            self.metrics.mark_publish_failed(str(err))
            raise
        self.metrics.mark_published()
        for cid, rev in sorted(result.changes.items()):
            verb = "published" if cid in configs else "deleted"
            log.info("%s config %s (revision %d)", verb, cid, rev)
        return result

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Render, publish, and follow the folder until ``stop`` is set (or cancelled)."""
        stop = stop or asyncio.Event()
        changes = awatch(self.root, stop_event=stop, debounce=self._debounce_ms, step=20)

        async def next_change() -> bool:
            try:
                await anext(changes)
            except StopAsyncIteration:
                return False
            return True

        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._publish_loop(), name="operator-publish")
            try:
                pending = tg.create_task(next_change(), name="operator-watch")
                # One turn of the loop runs the watcher up to its first wait: the OS watch now
                # exists and buffers events, so this first read misses no edit.
                await asyncio.sleep(0)
                self._safe_sync()
                self._wake.set()  # publish even an empty set: stale ids in Redis get deleted
                while await pending:
                    self._safe_sync()
                    pending = tg.create_task(next_change(), name="operator-watch")
            finally:
                self._closing.set()
                self._wake.set()
                await changes.aclose()

    async def _wait_for_work(self) -> None:
        """Until something changed, or Redis lost what was published (checked every so often)."""
        while True:
            try:
                async with asyncio.timeout(self._resync_check_s):
                    await self._wake.wait()
                return
            except TimeoutError:
                if self._sink is not None and await self._sink.store_lost():
                    log.warning("Redis lost the published configs: publishing them all again")
                    self._wake.set()

    async def _publish_loop(self) -> None:
        while True:
            await self._wait_for_work()
            if self._closing.is_set():
                return
            self._wake.clear()
            try:
                await self.publish_once()
            except PublishError as err:
                log.warning("publishing to Redis failed, retrying in %.1fs: %s", self._retry_s, err)
                try:
                    async with asyncio.timeout(self._retry_s):
                        await self._closing.wait()
                    return
                except TimeoutError:
                    self._wake.set()
