"""The status types every part of stunnerd shares: counters, listener states, apply outcomes.

A stunnerd process reports what it does through plain frozen data: the counters of a process
(`StatsSnapshot`, summed over worker processes with `merge_snapshots`), where each listener
stands (`ListenerState`), what applying a config did (`ApplyOutcome`), what a config change
means (`Plan`), the last config refused (`Rejection`) and the process's readiness
(`Lifecycle`). The dataplane produces them, the reconciler keeps them, the admin servers and the
worker wire read them; this module is the ground floor they all import, so that none of those
packages has to import another for its types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class TrafficStats:
    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0

    def __add__(self, other: TrafficStats) -> TrafficStats:
        return TrafficStats(
            self.rx_packets + other.rx_packets,
            self.rx_bytes + other.rx_bytes,
            self.tx_packets + other.tx_packets,
            self.tx_bytes + other.tx_bytes,
        )


@dataclass(frozen=True, slots=True)
class ListenerStats:
    name: str
    allocations: int = 0
    connections: int = 0
    connections_total: int = 0
    traffic: TrafficStats = field(default_factory=TrafficStats)
    refusals: tuple[tuple[int, int], ...] = ()
    """(code, count) of the error answers the listener gave, by code, ascending."""
    limit_refusals: tuple[tuple[str, int], ...] = ()
    """(limit, count) of the refusals by the limit behind them (`stunnerd.turn.refusals.LIMITS`,
    in that order), answered or not: dropped messages and closed connections count too."""


def _sum_refusals(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    total: dict[int, int] = dict(a)
    for code, n in b:
        total[code] = total.get(code, 0) + n
    return tuple(sorted(total.items()))


def _sum_limits(
    a: tuple[tuple[str, int], ...], b: tuple[tuple[str, int], ...]
) -> tuple[tuple[str, int], ...]:
    """Summed by limit, in the order the limits first appear."""
    total: dict[str, int] = dict(a)
    for limit, n in b:
        total[limit] = total.get(limit, 0) + n
    return tuple(total.items())


@dataclass(frozen=True, slots=True)
class ClusterStats:
    name: str
    traffic: TrafficStats = field(default_factory=TrafficStats)


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Counters of one process (or the sum over workers).

    `traffic_measured` is False when the server does not count packets and bytes; the packet and
    byte series are then left out rather than reported as zero.
    """

    listeners: tuple[ListenerStats, ...] = ()
    clusters: tuple[ClusterStats, ...] = ()
    traffic_measured: bool = True

    @property
    def allocations(self) -> int:
        return sum(lst.allocations for lst in self.listeners)

    def listener(self, name: str) -> ListenerStats:
        for lst in self.listeners:
            if lst.name == name:
                return lst
        return ListenerStats(name)

    def to_dict(self) -> dict[str, Any]:
        def traffic(t: TrafficStats) -> list[int]:
            return [t.rx_packets, t.rx_bytes, t.tx_packets, t.tx_bytes]

        return {
            "listeners": [
                [
                    x.name,
                    x.allocations,
                    x.connections,
                    x.connections_total,
                    traffic(x.traffic),
                    [list(r) for r in x.refusals],
                    [list(r) for r in x.limit_refusals],
                ]
                for x in self.listeners
            ],
            "clusters": [[c.name, traffic(c.traffic)] for c in self.clusters],
            "traffic_measured": self.traffic_measured,
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> StatsSnapshot:
        return StatsSnapshot(
            listeners=tuple(
                ListenerStats(
                    str(x[0]),
                    int(x[1]),
                    int(x[2]),
                    int(x[3]),
                    TrafficStats(*map(int, x[4])),
                    tuple((int(code), int(n)) for code, n in (x[5] if len(x) > 5 else ())),
                    tuple((str(limit), int(n)) for limit, n in (x[6] if len(x) > 6 else ())),
                )
                for x in data.get("listeners", ())
            ),
            clusters=tuple(
                ClusterStats(str(n), TrafficStats(*map(int, t)))
                for n, t in data.get("clusters", ())
            ),
            traffic_measured=bool(data.get("traffic_measured", True)),
        )


def merge_snapshots(snapshots: Iterable[StatsSnapshot]) -> StatsSnapshot:
    """Sum per-worker snapshots into one, keyed by listener and cluster name."""
    listeners: dict[str, ListenerStats] = {}
    clusters: dict[str, ClusterStats] = {}
    measured = True
    for snap in snapshots:
        measured = measured and snap.traffic_measured
        for lst in snap.listeners:
            prev = listeners.get(lst.name, ListenerStats(lst.name))
            listeners[lst.name] = ListenerStats(
                lst.name,
                prev.allocations + lst.allocations,
                prev.connections + lst.connections,
                prev.connections_total + lst.connections_total,
                prev.traffic + lst.traffic,
                _sum_refusals(prev.refusals, lst.refusals),
                _sum_limits(prev.limit_refusals, lst.limit_refusals),
            )
        for c in snap.clusters:
            prevc = clusters.get(c.name, ClusterStats(c.name))
            clusters[c.name] = ClusterStats(c.name, prevc.traffic + c.traffic)
    return StatsSnapshot(
        tuple(listeners[n] for n in sorted(listeners)),
        tuple(clusters[n] for n in sorted(clusters)),
        measured,
    )


ListenerStateName = Literal["serving", "retrying", "rejected"]


@dataclass(frozen=True, slots=True)
class ListenerState:
    """Where one configured listener stands.

    ``serving``: bound and answering. ``retrying``: it could not be brought up for a reason that
    may pass (a port in use, a bind error) and is tried again with backoff. ``rejected``: it
    cannot work as configured (TLS material that does not load, ...) and waits for a config that
    changes it. ``cause`` is the short label metrics count failures by; ``attempts`` counts the
    failed tries in a row.
    """

    name: str
    state: ListenerStateName
    reason: str = ""
    cause: str = ""
    attempts: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ListenerState:
        state = str(data.get("state", "rejected"))
        return ListenerState(
            str(data["name"]),
            state if state in ("serving", "retrying", "rejected") else "rejected",  # type: ignore[arg-type]
            str(data.get("reason", "")),
            str(data.get("cause", "")),
            int(data.get("attempts", 0)),
        )


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """What applying one config did (summed over workers where there are several)."""

    applied: bool
    ignored: bool = False
    restarted: tuple[str, ...] = ()
    error: str | None = None
    duration_s: float = 0.0
    started: tuple[tuple[str, int], ...] = ()
    """(listener name, bound port) of every listener this config started or restarted."""
    listeners: tuple[ListenerState, ...] = ()
    """The state of every listener of the config in force after this apply."""


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
        listeners = {
            "remove": self.remove_listeners,
            "restart": self.restart_listeners,
            "add": self.add_listeners,
            "update": self.update_listeners,
            "rotate-cert": self.rotate_certs,
        }
        flags = {
            "auth": self.update_auth,
            "clusters": self.update_clusters,
            "admin": self.update_admin,
            "health rebind": self.rebind_health,
            "metrics rebind": self.rebind_metrics,
            "offload restart": self.restart_offload,
        }
        parts = [f"{label} listeners {list(names)}" for label, names in listeners.items() if names]
        parts += [label for label, flag in flags.items() if flag]
        return "; ".join(parts) if parts else "no change"


@dataclass(frozen=True, slots=True)
class Rejection:
    """The last config refused whole, and why."""

    reason: str
    revision: int | None = None
    epoch: str | None = None
    at: float = 0.0
    """Seconds since the epoch (wall clock) when it was refused."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Lifecycle:
    """The process-wide readiness state the health server reports (`ready`: a listener serves)."""

    ready: bool = False
    draining: bool = False
    force_ready: bool = False

    @property
    def serving_ready(self) -> bool:
        if self.force_ready:
            return self.ready or self.draining
        return self.ready and not self.draining

    @property
    def status_word(self) -> str:
        if self.draining:
            return "TERMINATING"
        return "READY" if self.ready else "NOT-READY"
