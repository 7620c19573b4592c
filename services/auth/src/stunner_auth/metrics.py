"""Prometheus metrics of one auth service process, in a registry of its own (one per app).

Only the refusals of the HTTP limits (`stunner_common.io.http.limits`) are counted; ``/metrics``
serves them, open like the probes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class AuthMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.refusals = Counter(
            "stunner_auth_refusals",
            "Requests refused by a limit: connections_per_client (429), header_bytes (431),"
            " query_bytes (414), body_bytes (413), request_head_timeout (408),"
            " invalid_request (400).",
            ["limit"],
            registry=self.registry,
        )
