"""The config diff: which parts of the dataplane a new config touches, and how.

Upstream reconciles an object tree where each object answers None, Reconcile (in place) or
Restart. Here the same decisions are one pure function over two validated configs, so every row
of the change table is a table test without sockets. Two upstream quirks are fixed on purpose:
an auth type that crosses `none` restarts the listeners (a server built without auth cannot
start asking for it), and a TLS/DTLS cert or key change alone is planned as an in-place
certificate rotation that keeps allocations (the reconciler falls back to a restart where the
transport cannot swap its context).
"""

from __future__ import annotations

import base64
import binascii

from stunner_common.config import ClusterConfig, ListenerConfig, StunnerConfig
from stunnerd.status import Plan

HEALTH_OBJECT = "health: default-health"
METRICS_OBJECT = "metrics: default-metrics"
OFFLOAD_OBJECT = "offload: default-offload"

TLS_PROTOCOLS = frozenset({"TURN-TLS", "TURN-DTLS"})


def _decoded(pem_b64: str) -> bytes:
    """Cert and key are compared after base64 decoding, as upstream does."""
    try:
        return base64.b64decode(pem_b64, validate=False)
    except (binascii.Error, ValueError):
        return pem_b64.encode()


def listener_needs_restart(old: ListenerConfig, new: ListenerConfig) -> bool:
    """Protocol, address or port changed: new sockets are needed, allocations end."""
    return (old.protocol, old.address, old.port) != (new.protocol, new.address, new.port)


def listener_cert_changed(old: ListenerConfig, new: ListenerConfig) -> bool:
    return _decoded(old.cert) != _decoded(new.cert) or _decoded(old.key) != _decoded(new.key)


def listener_in_place_changed(old: ListenerConfig, new: ListenerConfig) -> bool:
    """Routes and the public address apply in place, also to live allocations."""
    return (tuple(old.routes), old.public_address, old.public_port) != (
        tuple(new.routes),
        new.public_address,
        new.public_port,
    )


def _dns_domains(cluster: ClusterConfig) -> frozenset[str]:
    return frozenset(e.lower() for e in cluster.endpoints)


def cluster_needs_restart(old: ClusterConfig, new: ClusterConfig) -> bool:
    """A STRICT_DNS domain set change or a type change re-registers the resolver.

    Unlike upstream, the domain comparison is case-insensitive *and* a case-only change is not
    a restart but also does not leave the resolver on the old spelling: the peer policy is
    rebuilt from the new config either way.
    """
    if old.type != new.type:
        return True
    if new.type == "STRICT_DNS":
        return _dns_domains(old) != _dns_domains(new)
    return False


def _auth_crosses_none(old: StunnerConfig, new: StunnerConfig) -> bool:
    return (old.auth.type == "none") != (new.auth.type == "none")


def _listener_actions(
    before: ListenerConfig, after: ListenerConfig, restart_all: bool
) -> tuple[str, ...]:
    """What a listener kept by name needs: restart, or any of rotate (its cert) and update."""
    if restart_all or listener_needs_restart(before, after):
        return ("restart",)
    cert_changed = listener_cert_changed(before, after)
    if cert_changed and after.protocol not in TLS_PROTOCOLS:
        return ("update",)  # cert/key on a plain listener are unused; keep the live config in step
    rotate = ("rotate",) if cert_changed else ()
    return rotate + (("update",) if listener_in_place_changed(before, after) else ())


def _listener_plan(
    old: StunnerConfig | None, new: StunnerConfig, restart_all: bool
) -> dict[str, list[str]]:
    """Listener names (sorted) by action: remove, add, restart, rotate, update."""
    old_listeners = {lst.name: lst for lst in old.listeners} if old is not None else {}
    new_listeners = {lst.name: lst for lst in new.listeners}
    plan: dict[str, list[str]] = {
        "remove": sorted(set(old_listeners) - set(new_listeners)),
        "add": sorted(set(new_listeners) - set(old_listeners)),
        "restart": [],
        "rotate": [],
        "update": [],
    }
    for name in sorted(set(old_listeners) & set(new_listeners)):
        for action in _listener_actions(old_listeners[name], new_listeners[name], restart_all):
            plan[action].append(name)
    return plan


def _restarted_clusters(old: StunnerConfig, new: StunnerConfig) -> list[str]:
    old_clusters = {c.name: c for c in old.clusters}
    new_clusters = {c.name: c for c in new.clusters}
    return [
        f"cluster: {name}"
        for name in sorted(set(old_clusters) & set(new_clusters))
        if cluster_needs_restart(old_clusters[name], new_clusters[name])
    ]


def _admin_changed(old: StunnerConfig, new: StunnerConfig) -> bool:
    """Name, log level, quota or license: applied in place."""
    before, after = old.admin, new.admin
    return (before.name, before.loglevel, before.user_quota, before.license_config) != (
        after.name,
        after.loglevel,
        after.user_quota,
        after.license_config,
    )


def _offload_changed(old: StunnerConfig, new: StunnerConfig) -> bool:
    return (old.admin.offload_engine, tuple(old.admin.offload_interfaces)) != (
        new.admin.offload_engine,
        tuple(new.admin.offload_interfaces),
    )


def plan_reconcile(old: StunnerConfig | None, new: StunnerConfig) -> Plan:
    """Compare the running config (None before the first one) with the desired one."""
    if old is None:
        return Plan(
            add_listeners=tuple(_listener_plan(None, new, False)["add"]),
            update_auth=True,
            update_clusters=True,
            update_admin=True,
            rebind_health=True,
            rebind_metrics=True,
        )
    restart_all = old.auth.realm != new.auth.realm or _auth_crosses_none(old, new)
    listeners = _listener_plan(old, new, restart_all)
    rebind_health = old.admin.healthcheck_endpoint != new.admin.healthcheck_endpoint
    rebind_metrics = old.admin.metrics_endpoint != new.admin.metrics_endpoint
    restart_offload = _offload_changed(old, new)
    restarted = [f"listener: {name}" for name in listeners["restart"]]
    restarted += _restarted_clusters(old, new)
    objects = (
        (HEALTH_OBJECT, rebind_health),
        (METRICS_OBJECT, rebind_metrics),
        (OFFLOAD_OBJECT, restart_offload),
    )
    restarted += [name for name, changed in objects if changed]
    return Plan(
        remove_listeners=tuple(listeners["remove"]),
        restart_listeners=tuple(listeners["restart"]),
        add_listeners=tuple(listeners["add"]),
        update_listeners=tuple(listeners["update"]),
        rotate_certs=tuple(listeners["rotate"]),
        update_auth=old.auth != new.auth,
        update_clusters={c.name: c for c in old.clusters} != {c.name: c for c in new.clusters},
        update_admin=_admin_changed(old, new),
        rebind_health=rebind_health,
        rebind_metrics=rebind_metrics,
        restart_offload=restart_offload,
        restarted=tuple(restarted),
    )
