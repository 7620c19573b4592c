"""Counter snapshots the admin surface reads: they live in `stunnerd.status` (the ground floor).

Kept so that `stunnerd.admin.stats` goes on naming them for the modules that import it from here.
"""

from stunnerd.status import (
    ClusterStats,
    ListenerStats,
    StatsSnapshot,
    TrafficStats,
    merge_snapshots,
)

__all__ = ["ClusterStats", "ListenerStats", "StatsSnapshot", "TrafficStats", "merge_snapshots"]
