"""The reconciler's order of operations and per-listener apply, against an in-memory dataplane.

The target here records what it is asked to do and keeps a table of running listeners, so the
tests can assert exactly which listeners were touched and what runs after a failure. The same
`ListenerReconciler` drives the real server in tests/integration/stunnerd; the `Reconciler`
that puts it and the admin endpoints together is driven here through `TableDataplane`, which is
`LocalDataplane.apply` over the table.
"""

from __future__ import annotations

import copy
import errno
from typing import Any

import pytest

from stunner_common.config import (
    ListenerConfig,
    StunnerConfig,
    parse_config,
    self_signed_pair,
    zero_config,
)
from stunnerd.reconcile.listeners import ListenerReconciler, ReconcileError
from stunnerd.reconcile.reconciler import Reconciler
from stunnerd.status import ApplyOutcome, ListenerState, Plan, StatsSnapshot


class TableTarget:
    def __init__(self) -> None:
        self.running: dict[str, ListenerConfig] = {}
        self.ops: list[str] = []
        self.policies: StunnerConfig | None = None
        self.fail_add: set[str] = set()
        self.fail_check: set[str] = set()
        self.can_rotate = True

    def check_listener(self, listener: ListenerConfig) -> None:
        if listener.name in self.fail_check:
            raise ValueError(f"cannot load cert/key pair for {listener.name}")

    def apply_policies(self, config: StunnerConfig) -> None:
        self.ops.append("policies")
        self.policies = config

    async def add_listener(self, listener: ListenerConfig, config: StunnerConfig) -> None:
        if listener.name in self.fail_add:
            raise OSError(errno.EADDRINUSE, f"address in use: {listener.port}")
        self.ops.append(f"add {listener.name}")
        self.running[listener.name] = listener

    async def remove_listener(self, name: str) -> None:
        self.ops.append(f"remove {name}")
        self.running.pop(name, None)

    def update_listener(self, listener: ListenerConfig, config: StunnerConfig) -> None:
        self.ops.append(f"update {listener.name}")
        self.running[listener.name] = listener

    def rotate_certificate(self, listener: ListenerConfig) -> bool:
        self.ops.append(f"rotate {listener.name}")
        if self.can_rotate:
            self.running[listener.name] = listener
        return self.can_rotate


class TableDataplane:
    """A `Dataplane` whose listeners are a `TableTarget`."""

    def __init__(self, target: TableTarget) -> None:
        self.listeners = ListenerReconciler(target)

    async def start(self) -> None:
        return None

    async def apply(self, config: StunnerConfig) -> ApplyOutcome:
        try:
            result = await self.listeners.apply(config)
        except ReconcileError as exc:
            return ApplyOutcome(applied=False, error=str(exc))
        return ApplyOutcome(
            applied=result.applied,
            ignored=result.ignored,
            started=tuple((name, 0) for name in result.started),
            listeners=result.listeners,
        )

    def stats(self) -> StatsSnapshot:
        return StatsSnapshot()

    async def refresh(self) -> None:
        return None

    def worker_status(self) -> None:
        return None

    def offload_status(self) -> dict[str, Any]:
        return {}

    def quota_status(self) -> dict[str, Any] | None:
        return None

    async def allocations(self) -> int:
        return 0

    async def stop_accepting(self) -> None:
        return None

    async def close(self) -> None:
        return None


class RecordingAdmin:
    def __init__(self) -> None:
        self.applied: list[tuple[str, Plan]] = []

    async def apply_admin(self, config: StunnerConfig, plan: Plan) -> dict[str, str]:
        self.applied.append((config.admin.loglevel, plan))
        return {}


def config(**listener_ports: int) -> StunnerConfig:
    data: dict[str, Any] = {
        "version": "v1",
        "admin": {"name": "ns/gw"},
        "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
        "listeners": [
            {"name": name, "protocol": "TURN-UDP", "address": "127.0.0.1", "port": port}
            for name, port in listener_ports.items()
        ],
        "clusters": [],
    }
    return parse_config(data)


def edited(cfg: StunnerConfig, **changes: Any) -> StunnerConfig:
    data = copy.deepcopy(cfg.to_dict())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        data[section][field] = value
    return parse_config(data)


async def test_the_first_config_starts_every_listener_after_installing_policies() -> None:
    target, admin = TableTarget(), RecordingAdmin()
    rec = Reconciler(TableDataplane(target), admin)
    result = await rec.apply(config(a=3478, b=3479), revision=7)
    assert result.applied
    assert target.ops == ["policies", "add a", "add b"]
    assert sorted(target.running) == ["a", "b"]
    assert rec.revision == 7
    assert len(admin.applied) == 1


async def test_an_identical_config_touches_nothing() -> None:
    target = TableTarget()
    rec = ListenerReconciler(target)
    await rec.apply(config(a=3478))
    target.ops.clear()
    result = await rec.apply(config(a=3478))
    assert result.plan.is_noop
    assert target.ops == []


async def test_the_zero_config_is_ignored_and_the_running_config_stays() -> None:
    target = TableTarget()
    rec = ListenerReconciler(target)
    first = config(a=3478)
    await rec.apply(first)
    target.ops.clear()
    result = await rec.apply(zero_config("ns/gw"))
    assert result.ignored
    assert target.ops == []
    assert rec.running == first


async def test_a_port_change_removes_then_restarts_only_that_listener() -> None:
    target = TableTarget()
    rec = ListenerReconciler(target)
    await rec.apply(config(a=3478, b=3479))
    target.ops.clear()
    result = await rec.apply(config(a=3478, b=4000))
    assert result.restarted == ("listener: b",)
    assert target.ops == ["policies", "remove b", "add b"]
    assert target.running["b"].port == 4000


async def test_a_listener_that_cannot_bind_is_left_out_and_the_rest_applies() -> None:
    target = TableTarget()
    rec = ListenerReconciler(target)
    await rec.apply(config(a=3478, b=3479))
    target.fail_add = {"c"}
    wanted = config(a=3478, b=4000, c=5000)
    result = await rec.apply(wanted)
    assert rec.running == wanted
    assert {name: lst.port for name, lst in target.running.items()} == {"a": 3478, "b": 4000}
    assert target.policies == wanted
    assert result.started == ("b",)
    states = {s.name: s for s in result.listeners}
    assert states["a"] == ListenerState("a", "serving")
    assert states["b"] == ListenerState("b", "serving")
    assert (states["c"].state, states["c"].cause, states["c"].attempts) == (
        "retrying",
        "port_in_use",
        1,
    )
    assert "address in use" in states["c"].reason


async def test_a_retrying_listener_is_tried_again_at_every_apply_until_it_serves() -> None:
    target = TableTarget()
    rec = ListenerReconciler(target)
    target.fail_add = {"b"}
    wanted = config(a=3478, b=3479)
    await rec.apply(wanted)
    again = await rec.apply(wanted)  # the same config: a retry
    assert {s.name: (s.state, s.attempts) for s in again.listeners} == {
        "a": ("serving", 0),
        "b": ("retrying", 2),
    }
    assert rec.applied_count == 1, "a retry is not another config"
    target.fail_add = set()
    target.ops.clear()
    freed = await rec.apply(wanted)
    assert freed.started == ("b",)
    assert target.ops == ["policies", "add b"]
    assert all(s.state == "serving" for s in freed.listeners)


async def test_a_bad_certificate_rejects_that_listener_only_until_its_config_changes() -> None:
    target = TableTarget()
    rec = ListenerReconciler(target)
    await rec.apply(config(a=3478))
    target.ops.clear()
    target.fail_check = {"b"}
    result = await rec.apply(config(a=3478, b=3479, c=3480))
    assert sorted(target.running) == ["a", "c"]
    states = {s.name: s for s in result.listeners}
    assert (states["b"].state, states["b"].cause) == ("rejected", "bad_certificate")
    assert "cannot load cert/key pair" in states["b"].reason
    target.ops.clear()
    await rec.apply(config(a=3478, b=3479, c=3480))
    assert target.ops == [], "the same rejected listener is not tried again"
    target.fail_check = set()
    fixed = await rec.apply(config(a=3478, b=3490, c=3480))
    assert "add b" in target.ops
    assert all(s.state == "serving" for s in fixed.listeners)


async def test_a_failure_of_the_whole_config_rolls_back_and_is_an_error() -> None:
    class PolicyFails(TableTarget):
        def apply_policies(self, config: StunnerConfig) -> None:
            if config.auth.realm == "bad":
                raise ValueError("no policy for that")
            super().apply_policies(config)

    target = PolicyFails()
    rec = ListenerReconciler(target)
    before = config(a=3478)
    await rec.apply(before)
    with pytest.raises(ReconcileError, match="no policy"):
        await rec.apply(edited(before, auth__realm="bad"))
    assert rec.running == before
    assert target.policies == before
    assert rec.failed_count == 1


async def test_the_reconciler_counts_failures_by_cause_and_retries_what_may_pass() -> None:
    target = TableTarget()
    rec = Reconciler(TableDataplane(target), RecordingAdmin())
    target.fail_add = {"b"}
    await rec.apply(config(a=3478, b=3479), revision=3, epoch="e1")
    assert (rec.revision, rec.epoch, rec.serving) == (3, "e1", 1)
    assert rec.retry_attempt() == 0
    retried = await rec.retry()
    assert retried is not None
    assert rec.retry_attempt() == 1
    assert rec.failures == {"port_in_use": 2}
    target.fail_add = set()
    freed = await rec.retry()
    assert freed is not None
    assert freed.started == (("b", 0),)
    assert (rec.serving, rec.retry_attempt()) == (2, None)
    assert await rec.retry() is None
    assert rec.counts() == {"applied": 1, "rejected": 0, "ignored": 0}


async def test_a_config_refused_whole_keeps_its_reason() -> None:
    rec = Reconciler(TableDataplane(TableTarget()), RecordingAdmin())
    rec.reject("invalid config from CDS: listeners[0].port: bad", revision=9, epoch="e2")
    assert rec.counts()["rejected"] == 1
    assert rec.last_rejection is not None
    assert (rec.last_rejection.reason, rec.last_rejection.revision) == (
        "invalid config from CDS: listeners[0].port: bad",
        9,
    )
    assert rec.failures == {"invalid_config": 1}


async def test_a_loglevel_change_reaches_the_admin_surface_without_touching_listeners() -> None:
    target, admin = TableTarget(), RecordingAdmin()
    rec = Reconciler(TableDataplane(target), admin)
    first = config(a=3478)
    await rec.apply(first)
    target.ops.clear()
    await rec.apply(edited(first, admin__loglevel="all:DEBUG"))
    assert admin.applied[-1][0] == "all:DEBUG"
    assert [op for op in target.ops if op != "policies"] == []


async def test_a_transport_that_cannot_rotate_certificates_is_restarted_instead() -> None:
    def tls(host: str) -> StunnerConfig:
        cert, key = self_signed_pair(host)
        data = {
            "version": "v1",
            "admin": {"name": "ns/gw"},
            "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
            "listeners": [
                {
                    "name": "tls",
                    "protocol": "TURN-TLS",
                    "port": 443,
                    "cert": cert,
                    "key": key,
                }
            ],
        }
        return parse_config(data)

    target = TableTarget()
    rec = ListenerReconciler(target)
    await rec.apply(tls("one.example"))
    target.ops.clear()
    target.can_rotate = False
    await rec.apply(tls("two.example"))
    assert target.ops == ["policies", "rotate tls", "remove tls", "add tls"]
