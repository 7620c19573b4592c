"""Cost of the shared config model, as ratios against plain-Python peers in the same run.

The operator renders and the CDS re-parses a config on every change, and stunnerd matches every
permission check against cluster endpoints, so these numbers say how much the model's validation
and normalisation add on top of the unavoidable work: JSON decoding, JSON encoding, string
comparison, and the standard library's ``ip in network`` check.
"""

from __future__ import annotations

import ipaddress
import json
import timeit
from collections.abc import Callable
from typing import Any

from stunner_common.config import StunnerConfig, parse_config, parse_endpoint
from stunner_common.config.endpoint import clear_endpoint_cache

LISTENERS = 20
CLUSTERS = 50
ENDPOINTS_PER_CLUSTER = 20
REPEATS = 5


def _big_config() -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {"name": "bench/gateway", "loglevel": "all:INFO"},
        "auth": {"type": "ephemeral", "credentials": {"secret": "s3cret"}},
        "listeners": [
            {
                "name": f"bench/gateway/l{i}",
                "protocol": "TURN-UDP" if i % 2 else "TURN-TCP",
                "address": "10.0.0.1",
                "port": 3478 + i,
                "routes": [f"bench/c{j}" for j in range(CLUSTERS)][::-1],
            }
            for i in range(LISTENERS)
        ],
        "clusters": [
            {
                "name": f"bench/c{j}",
                "endpoints": [
                    f"10.{j}.{k}.0/24:<10000-20000>" for k in range(ENDPOINTS_PER_CLUSTER)
                ],
            }
            for j in range(CLUSTERS)
        ],
    }


def _per_call_us(func: Callable[[], object], number: int) -> float:
    best = min(timeit.repeat(func, number=number, repeat=REPEATS))
    return best / number * 1e6


def _row(label: str, ours: float, peer: float, peer_label: str) -> None:
    print(
        f"{label:<32} {ours:10.2f} us  {peer_label:<25} {peer:10.2f} us  ratio {ours / peer:6.1f}x"
    )


def main() -> None:
    data = _big_config()
    cfg = parse_config(data, env={})
    text = cfg.canonical_json()
    twin: StunnerConfig = parse_config(text, env={})
    print(
        f"config: {LISTENERS} listeners, {CLUSTERS} clusters x {ENDPOINTS_PER_CLUSTER} endpoints,"
        f" {len(text)} bytes of canonical JSON"
    )
    loads_us = _per_call_us(lambda: json.loads(text), 200)

    def cold_parse() -> None:
        clear_endpoint_cache()
        parse_config(text, env={})

    _row("parse_config, endpoint cache cold", _per_call_us(cold_parse, 10), loads_us, "json.loads")
    _row(
        "parse_config, endpoint cache warm",
        _per_call_us(lambda: parse_config(text, env={}), 20),
        loads_us,
        "json.loads",
    )
    _row(
        "canonical_json()",
        _per_call_us(cfg.canonical_json, 50),
        _per_call_us(lambda: json.dumps(data, sort_keys=True, separators=(",", ":")), 200),
        "json.dumps(sort_keys)",
    )
    other_text = twin.canonical_json()
    _row(
        "config == config (deep, equal)",
        _per_call_us(lambda: cfg == twin, 2000),
        _per_call_us(lambda: text == other_text, 20000),
        "canonical str ==",
    )
    endpoint = parse_endpoint("10.20.0.0/16:<10000-20000>")
    network = ipaddress.ip_network("10.20.0.0/16")
    peer_ip = ipaddress.ip_address("10.20.3.4")
    _row(
        "Endpoint.matches(ip, port)",
        _per_call_us(lambda: endpoint.matches(peer_ip, 15000), 200_000),
        _per_call_us(lambda: peer_ip in network and 10000 <= 15000 <= 20000, 200_000),
        "ip in ip_network + range",
    )


if __name__ == "__main__":
    main()
