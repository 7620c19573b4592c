"""Counter snapshots the admin surface reads, decoupled from how the server keeps them.

A snapshot is plain frozen data so that one from each worker process can be summed into the
figures of the whole stunnerd, and so that serialising it for the supervisor is trivial.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


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


def _sum_refusals(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    total: dict[int, int] = dict(a)
    for code, n in b:
        total[code] = total.get(code, 0) + n
    return tuple(sorted(total.items()))


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
            )
        for c in snap.clusters:
            prevc = clusters.get(c.name, ClusterStats(c.name))
            clusters[c.name] = ClusterStats(c.name, prevc.traffic + c.traffic)
    return StatsSnapshot(
        tuple(listeners[n] for n in sorted(listeners)),
        tuple(clusters[n] for n in sorted(clusters)),
        measured,
    )
