"""Local mode: render a folder of Gateway API YAML into Redis and keep it in step with the folder.

One task watches the folder (``watchfiles``) and re-renders on every change; only the objects
that changed reach the renderer, so only the Gateways they affect are rendered again. Another
task publishes the full config set whenever it changed, retrying while Redis is away: rendering
never waits for Redis. Status changes are logged as one line per object, since there is no API
server to write them to: at INFO when all is well, at WARNING when a condition says the input is
wrong (a route to a Gateway that does not exist, a backend that is not found).

A mistake never tears down what runs. A document that fails its schema keeps the last good
version of each object in it (``loader``). A Gateway whose new version has a listener the
renderer rejects (``protocol: TURN-FOO``, two listeners on one port) is refused as a whole: its
last good version stays rendered, with its listeners and their allocations, and the refusal is
logged at ERROR with the rejected listener's own reason, counted in
``stunner_operator_manifest_errors`` and reported by ``/gateways`` (``stunnerctl status`` shows
the Gateway as degraded) until the Gateway is fixed or removed. A Gateway with no good version
yet is rendered without the rejected listener, with the same report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchfiles import awatch

from stunner_common.crds import Gateway, K8sObject, UDPRoute, UDPRouteV1A2
from stunner_common.io.store import PublishResult
from stunner_operator.manifests.loader import ManifestSet, object_label
from stunner_operator.observe import OperatorMetrics
from stunner_operator.publish import ConfigSink, PublishError, publish_configs
from stunner_operator.render.engine import RenderDelta, Renderer
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.routes import parent_is_gateway
from stunner_operator.render.status import GatewayStatus, RouteStatus, Status
from stunner_operator.render.store import ObjKey, View, key_of

log = logging.getLogger(__name__)


_object_label = object_label
_INPUT_CONDITIONS = ("Accepted", "ResolvedRefs")


def rejected_listeners(status: Status | None) -> list[str]:
    """The reasons of a Gateway status's listeners that are not accepted (their own spec)."""
    if not isinstance(status, GatewayStatus):
        return []
    out = []
    for ls in status.listeners:
        accepted = ls.condition("Accepted")
        if accepted is not None and accepted.status == "False":
            out.append(accepted.message or f"listener {ls.name}: {accepted.reason}")
    return out


def has_bad_condition(status: Status) -> bool:
    """Does any Accepted or ResolvedRefs condition say the input is wrong?"""
    if isinstance(status, RouteStatus):
        conds = [c for p in status.parents for c in p.conditions]
    else:
        conds = list(status.conditions)
        if isinstance(status, GatewayStatus):
            conds += [c for ls in status.listeners for c in ls.conditions]
    return any(c.type in _INPUT_CONDITIONS and c.status != "True" for c in conds)


def missing_parents(view: View, route: K8sObject) -> list[str]:
    """The Gateways (ns/name) a route's parentRefs name that do not exist."""
    if not isinstance(route, UDPRoute | UDPRouteV1A2):
        return []
    ns = route.metadata.namespace
    out = []
    for ref in route.spec.parent_refs:
        gns = ref.namespace or ns
        if parent_is_gateway(ref) and view.get(Gateway, gns, ref.name) is None:
            out.append(f"{gns}/{ref.name}")
    return out


def missing_parent_warning(view: View, route: K8sObject) -> str | None:
    """One line for a route whose parent Gateways do not exist, naming those that do."""
    missing = missing_parents(view, route)
    if not missing:
        return None
    known = sorted(f"{ns}/{name}" for ns, name in view.store.keys("Gateway"))
    return (
        f"parent Gateway {', '.join(missing)} does not exist, so no listener carries this route "
        f"(Gateways: {', '.join(known) or 'none'})"
    )


def _merge(first: RenderDelta, second: RenderDelta) -> RenderDelta:
    """Two renders in a row as one change (the later one wins per key)."""
    return dataclasses.replace(
        second,
        configs={**first.configs, **second.configs},
        deleted=(first.deleted | second.deleted) - frozenset(second.configs),
        statuses={**first.statuses, **second.statuses},
    )


@dataclass(frozen=True, slots=True)
class LocalOptions:
    """What the local operator is told by the operator's settings; ``__main__`` builds it once
    (``OPERATOR_WATCH_DEBOUNCE_MS``, ``OPERATOR_PUBLISH_RETRY_S`` and the render options)."""

    render: RenderOptions = field(default_factory=RenderOptions)
    debounce_ms: int = 50
    """How long the folder must be quiet before a change is rendered."""
    retry_s: float = 1.0
    """Delay before a failed publish is tried again."""
    resync_check_s: float = 1.0
    """Bound on the Redis check that the published configs are still there."""


class LocalOperator:
    """Owns the renderer for one folder; ``sync`` is the pure-ish step, ``run`` the loop."""

    def __init__(
        self,
        root: Path,
        sink: ConfigSink | None,
        options: LocalOptions = LocalOptions(),
        *,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.root = root
        self.metrics = metrics or OperatorMetrics()
        self.renderer = Renderer(options.render)
        self.manifests = ManifestSet(root)
        self._sink = sink
        self._applied: dict[ObjKey, K8sObject] = {}
        self._good: dict[ObjKey, K8sObject] = {}
        """Each Gateway's last version whose listeners were all accepted."""
        self._refused: dict[ObjKey, K8sObject] = {}
        """Gateway versions refused for a rejected listener (the folder still holds them)."""
        self.problems: dict[ObjKey, str] = {}
        """Per refused Gateway: why, and what stays in force (for /gateways and the metric)."""
        self._debounce_ms = options.debounce_ms
        self._retry_s = options.retry_s
        self._resync_check_s = options.resync_check_s
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()

    def sync(self) -> RenderDelta:
        """Re-read the folder, render what changed, log errors and status changes."""
        desired = self._desired()
        upserts = [obj for key, obj in desired.items() if self._applied.get(key) != obj]
        deletes = [key for key in self._applied if key not in desired]
        started = time.perf_counter()
        delta = self.renderer.apply(upserts, deletes)
        fallback = self._refuse_rejected(upserts, desired)
        if fallback:
            delta = _merge(delta, self.renderer.apply(fallback, ()))
        self._forget_gone(desired)
        self._applied = desired
        self.metrics.observe_render(
            time.perf_counter() - started, self.renderer.store, len(self.renderer.configs())
        )
        self.metrics.manifest_errors.set(len(self.manifests.errors) + len(self.problems))
        self._log_delta(delta, set(deletes), desired, upserts)
        if delta.configs_changed:
            self._wake.set()
        return delta

    def _desired(self) -> dict[ObjKey, K8sObject]:
        """The folder's objects, with each Gateway version refused before kept refused."""
        result = self.manifests.reload()
        for skipped in result.skipped:
            log.info("skipping %s", skipped)
        for err in result.new_errors:
            log.error("%s (%s)", err, err.keeps)
        desired = dict(result.objects)
        for key, refused in list(self._refused.items()):
            # A Gateway version refused before stays refused while the folder still says it.
            if desired.get(key) == refused and key in self._good:
                desired[key] = self._good[key]
            elif key in desired and desired[key] == self._good.get(key):
                # Back to exactly the version in force: nothing to render, the refusal is over.
                del self._refused[key]
                self._refusal_over(key)
        return desired

    def _refusal_over(self, key: ObjKey) -> None:
        self.problems.pop(key, None)
        log.info("%s: fixed; its new version is in force", object_label(key))

    def _refuse_rejected(
        self, upserts: list[K8sObject], desired: dict[ObjKey, K8sObject]
    ) -> list[K8sObject]:
        """Refuse each new Gateway version with a rejected listener; returns the last good
        versions to render again in their place (also put in ``desired``)."""
        fallback: list[K8sObject] = []
        for obj in upserts:
            key = key_of(obj)
            if key[0] != "Gateway":
                continue
            render = self.renderer.gateway(key[1], key[2])
            rejected = rejected_listeners(render.status if render is not None else None)
            if not rejected:
                self._good[key] = obj
                if self._refused.pop(key, None) is not None:
                    self._refusal_over(key)
                continue
            good = self._good.get(key)
            keeps = (
                "keeping the last good version of this Gateway, its listeners and allocations"
                if good is not None
                else "the listener is left out (this Gateway has no good version to keep)"
            )
            problem = f"{'; '.join(rejected)} ({keeps})"
            if self.problems.get(key) != problem:
                log.error("%s: %s", object_label(key), problem)
            self.problems[key] = problem
            self._refused[key] = obj
            if good is not None:
                fallback.append(good)
                desired[key] = good
        return fallback

    def _forget_gone(self, desired: dict[ObjKey, K8sObject]) -> None:
        """Drop the refusals and good versions of Gateways that left the folder."""
        for key in list(self.problems):
            if key not in desired:
                self.problems.pop(key, None)
                self._refused.pop(key, None)
        for key in list(self._good):
            if key not in desired:
                del self._good[key]

    def _log_delta(
        self,
        delta: RenderDelta,
        gone: set[ObjKey],
        desired: dict[ObjKey, K8sObject],
        upserts: list[K8sObject],
    ) -> None:
        """One line per status change, per route without a parent, per config removed."""
        view = View(self.renderer.store)
        for key in sorted(delta.statuses):
            self._log_status(view, key, delta.statuses[key], gone, desired)
        for obj in upserts:
            key = key_of(obj)
            # A route no Gateway of this operator renders has no status to change: say so.
            if (
                key not in delta.statuses
                and key[0] in ("UDPRoute", "UDPRouteV1A2")
                and (warning := missing_parent_warning(view, obj)) is not None
            ):
                log.warning("%s: %s", _object_label(key), warning)
        for cid in sorted(delta.deleted):
            log.info("config %s removed", cid)

    def _log_status(
        self,
        view: View,
        key: ObjKey,
        status: Status | None,
        gone: set[ObjKey],
        desired: dict[ObjKey, K8sObject],
    ) -> None:
        if key in gone:
            log.info("%s: deleted", _object_label(key))
        elif status is None:
            current = desired.get(key)
            warning = missing_parent_warning(view, current) if current is not None else None
            if warning is not None:
                log.warning("%s: %s", _object_label(key), warning)
            else:
                log.info("%s: no status (not managed by this operator)", _object_label(key))
        else:
            level = logging.WARNING if has_bad_condition(status) else logging.INFO
            log.log(level, "%s: %s", _object_label(key), status.summary())
            self._log_warnings(key)

    def gateway_report(self) -> dict[str, Any]:
        """What ``/gateways`` answers: every Gateway's state (ok or degraded, with the reasons)
        and the manifest errors in force."""
        gateways = []
        for render in self.renderer.gateway_renders():
            key = render.key
            reasons = []
            if key in self.problems:
                reasons.append(self.problems[key])
            status = render.status
            if isinstance(status, GatewayStatus):
                reasons += [
                    c.message or f"listener {ls.name}: {c.reason}"
                    for ls in status.listeners
                    for c in ls.conditions
                    if c.type in _INPUT_CONDITIONS and c.status != "True"
                ]
            if render.error is not None:
                reasons.append(render.error)
            if status is None and render.error is None:
                continue  # another controller's Gateway
            gateways.append(
                {
                    "name": f"{key[1]}/{key[2]}",
                    "state": "degraded" if reasons else "ok",
                    "reasons": reasons,
                    "summary": status.summary() if status is not None else "",
                }
            )
        return {
            "gateways": gateways,
            "manifestErrors": [str(e) for e in self.manifests.errors],
        }

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
            with self.metrics.loop("render"):
                self.sync()
        except Exception:
            log.exception("rendering %s failed; the published configs are unchanged", self.root)

    async def publish_once(self) -> PublishResult | None:
        if self._sink is None:
            return None
        return await publish_configs(self._sink, self.renderer.configs(), self.metrics)

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
