"""Carry out a reconcile plan against this process's listeners, rolling back when a step fails.

The order follows upstream (reference §2.2): check everything that can be checked without side
effects (TLS material) first, then swap the policies of the running listeners (once: routes,
auth and quota of every listener that keeps running), stop removed and restarting listeners,
rotate certificates, and start restarted and new listeners (which are built with the new
policies). A failure part-way runs the reverse plan (new → previous) best effort, so the
previous config keeps serving, and the original error is reported. Configs are applied one at
a time: the reconciler holds a lock for the whole apply. The admin endpoints are not touched
here: `stunnerd.reconcile.reconciler.Reconciler` applies them in the supervising process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from stunner_common.config import ListenerConfig, StunnerConfig, is_zero_config
from stunnerd.reconcile.plan import Plan, plan_reconcile

log = logging.getLogger(__name__)


class ReconcileError(Exception):
    """A config could not be applied; the previous config was restored."""


class ListenerTarget(Protocol):
    """The parts of the running server a reconcile drives (`stunnerd.net.server.TurnServer`)."""

    def check_listener(self, listener: ListenerConfig) -> None:
        """Raise if the listener cannot be built (e.g. bad cert/key); no side effects."""

    def apply_policies(self, config: StunnerConfig) -> None:
        """Swap auth, peer admission and quota policies in place for every running listener.

        This is the in-place update of a listener whose spec did not change: routes, public
        address, auth and quota all live in its policies.
        """

    async def add_listener(self, listener: ListenerConfig, config: StunnerConfig) -> None:
        """Bind and start a listener (replacing one of the same name if it exists)."""

    async def remove_listener(self, name: str) -> None:
        """Close a listener and end its allocations; a no-op for an unknown name."""

    def rotate_certificate(self, listener: ListenerConfig) -> bool:
        """Swap the TLS/DTLS credentials in place; False if the transport cannot."""


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    plan: Plan
    applied: bool
    ignored: bool = False
    duration_s: float = 0.0
    revision: int | None = None

    @property
    def restarted(self) -> tuple[str, ...]:
        return self.plan.restarted


class ListenerReconciler:
    """Applies configs to `target` one at a time; `running` is the config now in force."""

    def __init__(
        self,
        target: ListenerTarget,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._target = target
        self._clock = clock
        self._lock = asyncio.Lock()
        self.running: StunnerConfig | None = None
        self.revision: int | None = None
        self.generation = 0
        self.applied_count = 0
        self.failed_count = 0

    async def apply(self, config: StunnerConfig, *, revision: int | None = None) -> ReconcileResult:
        async with self._lock:
            started = self._clock()
            if is_zero_config(config):
                log.info("ignoring the zero (delete) config for %s", config.admin.name)
                return ReconcileResult(Plan(), applied=False, ignored=True)
            previous = self.running
            plan = plan_reconcile(previous, config)
            if plan.is_noop:
                self.revision = revision if revision is not None else self.revision
                return ReconcileResult(plan, applied=True, revision=self.revision)
            try:
                self._check(plan, config)
            except Exception as exc:
                self.failed_count += 1
                log.error("config rejected, running configuration unchanged: %s", exc)
                raise ReconcileError(str(exc)) from exc
            try:
                await self._execute(plan, config)
            except Exception as exc:
                self.failed_count += 1
                log.error("applying config failed, running configuration unchanged: %s", exc)
                await self._rollback(config, previous)
                raise ReconcileError(str(exc)) from exc
            self.running = config
            self.revision = revision if revision is not None else self.revision
            self.generation += 1
            self.applied_count += 1
            duration = self._clock() - started
            if plan.restarted:
                log.info(
                    "config applied in %.1f ms, restarted: %s",
                    duration * 1e3,
                    ", ".join(f"[{r}]" for r in plan.restarted),
                )
            else:
                log.info("config applied in %.1f ms: %s", duration * 1e3, plan.describe())
            return ReconcileResult(plan, applied=True, duration_s=duration, revision=self.revision)

    def _check(self, plan: Plan, new: StunnerConfig) -> None:
        """Everything that can fail without side effects fails here, before any change."""
        listeners = {lst.name: lst for lst in new.listeners}
        for name in (*plan.restart_listeners, *plan.add_listeners, *plan.rotate_certs):
            self._target.check_listener(listeners[name])

    async def _execute(self, plan: Plan, new: StunnerConfig) -> None:
        listeners = {lst.name: lst for lst in new.listeners}
        to_start = [*plan.restart_listeners, *plan.add_listeners]
        self._target.apply_policies(new)
        for name in (*plan.remove_listeners, *plan.restart_listeners):
            await self._target.remove_listener(name)
        for name in plan.rotate_certs:
            if not self._target.rotate_certificate(listeners[name]):
                log.info("listener %s cannot rotate its certificate in place, restarting", name)
                await self._target.remove_listener(name)
                await self._target.add_listener(listeners[name], new)
        for name in to_start:
            await self._target.add_listener(listeners[name], new)

    async def _rollback(self, failed: StunnerConfig, previous: StunnerConfig | None) -> None:
        """Best effort: walk back from the failed config to the previous one."""
        if previous is None:
            for lst in failed.listeners:
                await self._best_effort(self._target.remove_listener(lst.name))
            return
        back = plan_reconcile(failed, previous)
        listeners = {lst.name: lst for lst in previous.listeners}
        try:
            self._target.apply_policies(previous)
        except Exception:
            log.exception("rollback: restoring policies failed")
        for name in (*back.remove_listeners, *back.restart_listeners):
            await self._best_effort(self._target.remove_listener(name))
        for name in back.rotate_certs:
            try:
                self._target.rotate_certificate(listeners[name])
            except Exception:
                log.exception("rollback: restoring the certificate of %s failed", name)
        # Re-add every previous listener that is not known to be running unchanged.
        for name in (*back.restart_listeners, *back.add_listeners):
            await self._best_effort(self._target.add_listener(listeners[name], previous))

    @staticmethod
    async def _best_effort(step: Awaitable[None]) -> None:
        try:
            await step
        except Exception:
            log.exception("rollback step failed")
