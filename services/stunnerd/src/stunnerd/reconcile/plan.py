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
from dataclasses import dataclass

from stunner_common.config import ClusterConfig, ListenerConfig, StunnerConfig

HEALTH_OBJECT = "health: default-health"
METRICS_OBJECT = "metrics: default-metrics"
OFFLOAD_OBJECT = "offload: default-offload"

TLS_PROTOCOLS = frozenset({"TURN-TLS", "TURN-DTLS"})


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do to move the running dataplane from one config to the next.

    Listener names are sorted in every tuple. `restarted` lists the objects upstream reports in
    its `ErrRestarted` (`"listener: <name>"`, `"cluster: <name>"`, ...); adding or removing an
    object is not a restart.
    """

    remove_listeners: tuple[str, ...] = ()
    restart_listeners: tuple[str, ...] = ()
    add_listeners: tuple[str, ...] = ()
    update_listeners: tuple[str, ...] = ()
    rotate_certs: tuple[str, ...] = ()
    update_auth: bool = False
    update_clusters: bool = False
    update_admin: bool = False
    rebind_health: bool = False
    rebind_metrics: bool = False
    restart_offload: bool = False
    restarted: tuple[str, ...] = ()

    @property
    def is_noop(self) -> bool:
        return self == Plan()

    def describe(self) -> str:
        """A one-line summary for logs (never includes credentials)."""
        parts = []
        for label, names in (
            ("remove", self.remove_listeners),
            ("restart", self.restart_listeners),
            ("add", self.add_listeners),
            ("update", self.update_listeners),
            ("rotate-cert", self.rotate_certs),
        ):
            if names:
                parts.append(f"{label} listeners {list(names)}")
        for label, flag in (
            ("auth", self.update_auth),
            ("clusters", self.update_clusters),
            ("admin", self.update_admin),
            ("health rebind", self.rebind_health),
            ("metrics rebind", self.rebind_metrics),
            ("offload restart", self.restart_offload),
        ):
            if flag:
                parts.append(label)
        return "; ".join(parts) if parts else "no change"


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


def plan_reconcile(old: StunnerConfig | None, new: StunnerConfig) -> Plan:
    """Compare the running config (None before the first one) with the desired one."""
    old_listeners = {lst.name: lst for lst in old.listeners} if old is not None else {}
    new_listeners = {lst.name: lst for lst in new.listeners}

    restart_all = old is not None and (
        old.auth.realm != new.auth.realm or _auth_crosses_none(old, new)
    )

    remove = sorted(set(old_listeners) - set(new_listeners))
    add = sorted(set(new_listeners) - set(old_listeners))
    restart: list[str] = []
    update: list[str] = []
    rotate: list[str] = []
    for name in sorted(set(old_listeners) & set(new_listeners)):
        before, after = old_listeners[name], new_listeners[name]
        if restart_all or listener_needs_restart(before, after):
            restart.append(name)
            continue
        cert_changed = listener_cert_changed(before, after)
        if cert_changed and after.protocol in TLS_PROTOCOLS:
            rotate.append(name)
        elif cert_changed:
            # cert/key on a plain listener are unused; keep the live config in step only.
            update.append(name)
            continue
        if listener_in_place_changed(before, after):
            update.append(name)

    restarted = [f"listener: {name}" for name in restart]

    if old is None:
        return Plan(
            add_listeners=tuple(add),
            update_auth=True,
            update_clusters=True,
            update_admin=True,
            rebind_health=True,
            rebind_metrics=True,
            restart_offload=False,
            restarted=(),
        )

    old_clusters = {c.name: c for c in old.clusters}
    new_clusters = {c.name: c for c in new.clusters}
    update_clusters = old_clusters != new_clusters
    for name in sorted(set(old_clusters) & set(new_clusters)):
        if cluster_needs_restart(old_clusters[name], new_clusters[name]):
            restarted.append(f"cluster: {name}")

    rebind_health = old.admin.healthcheck_endpoint != new.admin.healthcheck_endpoint
    rebind_metrics = old.admin.metrics_endpoint != new.admin.metrics_endpoint
    restart_offload = (old.admin.offload_engine, tuple(old.admin.offload_interfaces)) != (
        new.admin.offload_engine,
        tuple(new.admin.offload_interfaces),
    )
    if rebind_health:
        restarted.append(HEALTH_OBJECT)
    if rebind_metrics:
        restarted.append(METRICS_OBJECT)
    if restart_offload:
        restarted.append(OFFLOAD_OBJECT)

    update_admin = (
        old.admin.name,
        old.admin.loglevel,
        old.admin.user_quota,
        old.admin.license_config,
    ) != (new.admin.name, new.admin.loglevel, new.admin.user_quota, new.admin.license_config)

    return Plan(
        remove_listeners=tuple(remove),
        restart_listeners=tuple(restart),
        add_listeners=tuple(add),
        update_listeners=tuple(update),
        rotate_certs=tuple(rotate),
        update_auth=old.auth != new.auth,
        update_clusters=update_clusters,
        update_admin=update_admin,
        rebind_health=rebind_health,
        rebind_metrics=rebind_metrics,
        restart_offload=restart_offload,
        restarted=tuple(restarted),
    )
