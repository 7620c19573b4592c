"""Carry out a reconcile plan against this process's listeners, one listener at a time.

The order follows upstream's stunnerd (its `Reconcile` in
https://github.com/l7mp/stunner/blob/main/stunner.go): swap the policies of the running listeners
(once: routes, auth and quota of every listener that keeps running), stop removed and restarting
listeners, rotate certificates, and start restarted and new listeners (which are built with the new
policies). Unlike upstream, one listener that cannot be brought up does not take the others down: a
listener whose TLS material does not load is *rejected* (left out until a config changes it), one
whose socket cannot be bound (port in use, address not available) is *retrying* (left out, and tried
again at every later apply, which the caller schedules with backoff); every other listener, cluster
and auth change applies. Only a step that concerns the whole config (the policies) failing rolls
back to the previous config, best effort, and is reported as an error. Configs are applied one at a
time: the reconciler holds a lock for the whole apply. The admin endpoints are not touched here:
`stunnerd.reconcile.reconciler.Reconciler` applies them in the supervising process.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stunner_common.config import ListenerConfig, StunnerConfig, is_zero_config
from stunnerd.reconcile.plan import plan_reconcile
from stunnerd.status import ListenerState, Plan

log = logging.getLogger(__name__)


class ReconcileError(Exception):
    """A config could not be applied; the previous config was restored."""


class ListenerTarget(Protocol):
    """The parts of the running server a reconcile drives (`stunnerd.net.server.TurnServer`)."""

    def check_listener(self, listener: ListenerConfig) -> None:
        """Raise if the listener cannot be built (e.g. bad cert/key); no side effects."""

    async def add_listener(self, listener: ListenerConfig, config: StunnerConfig) -> None:
        """Bind and start a listener (replacing one of the same name if it exists).

        Raises with an `OSError` as the cause when the socket cannot be bound."""

    def apply_policies(self, config: StunnerConfig) -> None:
        """Swap auth, peer admission and quota policies in place for every running listener.

        This is the in-place update of a listener whose spec did not change: routes, public
        address, auth and quota all live in its policies.
        """

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
    started: tuple[str, ...] = ()
    """Listeners this apply brought up (new, restarted, or retried with success)."""
    listeners: tuple[ListenerState, ...] = ()

    @property
    def restarted(self) -> tuple[str, ...]:
        return self.plan.restarted


def failure_cause(exc: BaseException) -> tuple[str, bool]:
    """(metrics label, whether it may pass by itself) for a listener that did not come up."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError):
            if cause.errno == errno.EADDRINUSE:
                return "port_in_use", True
            return "bind_error", True
        cause = cause.__cause__
    return "listener_error", False


class ListenerReconciler:
    """Applies configs to `target` one at a time; `running` is the config now in force.

    `states` holds the state of every listener of `running`; a listener that is not serving is
    tried again at the next apply (of any config, the same one included).
    """

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
        self.states: dict[str, ListenerState] = {}
        # The listener config a rejection was for: the same spec is not tried again.
        self._rejected: dict[str, ListenerConfig] = {}

    def listener_states(self) -> tuple[ListenerState, ...]:
        return tuple(self.states[name] for name in sorted(self.states))

    def _pending(self, config: StunnerConfig) -> list[ListenerConfig]:
        """Listeners of `config` that are not serving and are worth another try."""
        return [
            lst
            for lst in config.listeners
            if (state := self.states.get(lst.name)) is None
            or (state.state == "retrying")
            or (state.state == "rejected" and self._rejected.get(lst.name) != lst)
        ]

    async def apply(self, config: StunnerConfig, *, revision: int | None = None) -> ReconcileResult:
        async with self._lock:
            started = self._clock()
            if is_zero_config(config):
                log.info("ignoring the zero (delete) config for %s", config.admin.name)
                return ReconcileResult(Plan(), applied=False, ignored=True)
            previous = self.running
            plan = plan_reconcile(previous, config)
            if plan.is_noop and not self._pending(config):
                self.revision = revision if revision is not None else self.revision
                return ReconcileResult(
                    plan, applied=True, revision=self.revision, listeners=self.listener_states()
                )
            try:
                self._target.apply_policies(config)
            except Exception as exc:
                self.failed_count += 1
                log.error("config rejected, running configuration unchanged: %s", exc)
                await self._restore_policies(previous)
                raise ReconcileError(str(exc)) from exc
            up = await self._execute(plan, config)
            self.running = config
            self.revision = revision if revision is not None else self.revision
            if not plan.is_noop:
                self.generation += 1
                self.applied_count += 1
            duration = self._clock() - started
            if plan.restarted:
                log.info(
                    "config applied in %.1f ms, restarted: %s",
                    duration * 1e3,
                    ", ".join(f"[{r}]" for r in plan.restarted),
                )
            elif not plan.is_noop:
                log.info("config applied in %.1f ms: %s", duration * 1e3, plan.describe())
            return ReconcileResult(
                plan,
                applied=True,
                duration_s=duration,
                revision=self.revision,
                started=tuple(up),
                listeners=self.listener_states(),
            )

    async def _execute(self, plan: Plan, new: StunnerConfig) -> list[str]:
        """Carry the plan out listener by listener; return the names that came up."""
        listeners = {lst.name: lst for lst in new.listeners}
        for name in (*plan.remove_listeners, *plan.restart_listeners):
            await self._target.remove_listener(name)
            self.states.pop(name, None)
            self._rejected.pop(name, None)
        for name in plan.rotate_certs:
            state = self.states.get(name)
            if state is None or state.state != "serving":
                continue  # not running: started (or retried) below with the new material
            try:
                self._target.check_listener(listeners[name])
                rotated = self._target.rotate_certificate(listeners[name])
            except Exception as exc:
                await self._target.remove_listener(name)
                self._reject(listeners[name], exc)
                continue
            if not rotated:
                log.info("listener %s cannot rotate its certificate in place, restarting", name)
                await self._target.remove_listener(name)
                self.states.pop(name, None)
        for stale in set(self.states) - set(listeners):
            del self.states[stale]
            self._rejected.pop(stale, None)
        up: list[str] = []
        for lst in sorted(self._pending(new), key=lambda item: item.name):
            if await self._start(lst, new):
                up.append(lst.name)
        return up

    async def _start(self, listener: ListenerConfig, config: StunnerConfig) -> bool:
        name = listener.name
        try:
            self._target.check_listener(listener)
        except Exception as exc:
            self._reject(listener, exc)
            return False
        try:
            await self._target.add_listener(listener, config)
        except Exception as exc:
            cause, passes = failure_cause(exc)
            if not passes:
                self._reject(listener, exc, cause)
                return False
            before = self.states.get(name)
            attempts = before.attempts + 1 if before and before.state == "retrying" else 1
            self.states[name] = ListenerState(name, "retrying", str(exc), cause, attempts)
            log.warning(
                "listener %s left out, retrying (attempt %d failed): %s", name, attempts, exc
            )
            return False
        self.states[name] = ListenerState(name, "serving")
        self._rejected.pop(name, None)
        return True

    def _reject(
        self, listener: ListenerConfig, exc: BaseException, cause: str = "bad_certificate"
    ) -> None:
        self.states[listener.name] = ListenerState(listener.name, "rejected", str(exc), cause)
        self._rejected[listener.name] = listener
        log.error("listener %s rejected, left out until its config changes: %s", listener.name, exc)

    async def _restore_policies(self, previous: StunnerConfig | None) -> None:
        if previous is None:
            return
        try:
            self._target.apply_policies(previous)
        except Exception:
            log.exception("rollback: restoring policies failed")
