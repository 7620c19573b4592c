"""Prometheus metrics of one CDS process, in a registry of its own (one per app instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class CdsMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.watchers = Gauge(
            "stunner_cds_watchers", "Open watch connections.", ["mode"], registry=self.registry
        )
        self.frames_sent = Counter(
            "stunner_cds_frames_sent", "WebSocket frames sent.", ["mode"], registry=self.registry
        )
        self.frames_direct = Counter(
            "stunner_cds_frames_direct",
            "Of the frames sent, those written straight to an idle watcher's connection, built"
            " once per change (the rest went through the watcher's queue).",
            ["mode"],
            registry=self.registry,
        )
        self.direct_writes: dict[str, int] = {"v1": 0, "v2": 0}
        """Direct writes by mode, counted as plain ints on the fan-out path and added to
        ``frames_sent`` and ``frames_direct`` at each scrape (``count_direct_writes``)."""
        self.frames_superseded = Counter(
            "stunner_cds_frames_superseded",
            "Frames replaced before they were sent by a newer change of the same config (a"
            " watcher reading slower than its config changes gets the newest state).",
            ["mode"],
            registry=self.registry,
        )
        self.v1_changes_held = Counter(
            "stunner_cds_v1_changes_held",
            "Changes of a config its v1 watchers never got: a newer change came within"
            " CDS_V1_MIN_INTERVAL_S and was sent in their place.",
            registry=self.registry,
        )
        self.watchers_dropped = Counter(
            "stunner_cds_watchers_dropped",
            "Watchers closed by the server.",
            ["reason"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "stunner_cds_refusals",
            "Requests refused by a limit: watchers_per_client (429), connections_per_client"
            " (429), header_bytes (431), query_bytes (414), body_bytes (413),"
            " request_head_timeout (408), invalid_request (400).",
            ["limit"],
            registry=self.registry,
        )
        self.event_lag = Histogram(
            "stunner_cds_event_lag_seconds",
            "Time from the Redis write of a change to the CDS applying it.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.fanout = Histogram(
            "stunner_cds_fanout_seconds",
            "Time to hand one change to every watcher of its config: its frames encoded, then"
            " written to each idle watcher's connection or queued for a busy one.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "stunner_cds_watcher_queue_depth_max",
            "Frames waiting in the fullest watcher queue.",
            registry=self.registry,
        )
        self.revision = Gauge(
            "stunner_cds_revision", "Store revision the CDS holds.", registry=self.registry
        )
        self.redis_up = Gauge(
            "stunner_cds_redis_up", "1 when Redis is reachable and in sync.", registry=self.registry
        )
        self.reloads = Counter(
            "stunner_cds_snapshot_reloads", "Snapshot loads from Redis.", registry=self.registry
        )
        self.resets = Counter(
            "stunner_cds_store_resets",
            "Reloads that crossed a lost store history (another epoch, or fewer revisions).",
            registry=self.registry,
        )
        self.configs = Gauge("stunner_cds_configs", "Configs held.", registry=self.registry)

    def count_direct_writes(self) -> None:
        """Move the direct writes counted since the last scrape into their counters."""
        for mode, count in self.direct_writes.items():
            if count:
                self.direct_writes[mode] = 0
                self.frames_sent.labels(mode).inc(count)
                self.frames_direct.labels(mode).inc(count)
