"""The human-readable forms of stunnerctl's output, as pure functions of the data.

`config_summary` follows upstream stunnerctl's summary of a running config line for line
(`Gateway: ns/name (loglevel: "…")`, the authentication line, then per listener its name,
protocol, public address and port, routes and the endpoints of those routes' clusters), so
that what users of upstream read in its docs reads the same here. Credentials are printed, as
upstream does: the point of the command is to tell a user what to put in a client.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from stunner_common.config import StunnerConfig

NONE = "<none>"


def config_summary(config: StunnerConfig) -> str:
    admin, auth = config.admin, config.auth
    lines = [f'Gateway: {admin.name} (loglevel: "{admin.loglevel}")']
    creds = auth.credentials
    if auth.type == "static":
        lines.append(
            "Authentication type: static, username/password: "
            f"{creds.get('username', '')}/{creds.get('password', '')}"
        )
    elif auth.type == "ephemeral":
        lines.append(f"Authentication type: ephemeral, shared-secret: {creds.get('secret', '')}")
    else:
        lines.append("Authentication type: none")
    lines.append("Listeners:")
    if not config.listeners:
        lines.append("  <none>: every listener was left out (`stunnerctl status` says why)")
    clusters = {c.name: c for c in config.clusters}
    for lst in config.listeners:
        endpoints = [
            ep for route in lst.routes if route in clusters for ep in clusters[route].endpoints
        ]
        public = f"{lst.public_address or NONE}:{lst.public_port or NONE}"
        lines += [
            f"  - Name: {lst.name}",
            f"    Protocol: {lst.protocol}",
            f"    Public address:port: {public}",
            f"    Routes: [{', '.join(lst.routes)}]",
            f"    Endpoints: [{', '.join(endpoints)}]",
        ]
    return "\n".join(lines)


def status_summary(
    gateway: str, url: str, status: Mapping[str, Any], degraded: list[str] | None = None
) -> str:
    """One stunnerd's `/status` in a few lines: its state, allocations and listeners; a Gateway
    the operator reports degraded says DEGRADED and why, the stunnerd's own state beside it."""
    state = str(status.get("status", NONE))
    if degraded:
        state = f"DEGRADED (stunnerd {state})"
    lines = [
        f"Gateway: {gateway} status: {state}, "
        f"allocations: {status.get('allocationCount', NONE)} ({url})"
    ]
    if degraded:
        lines.append(degraded_summary(degraded))
    for lst in status.get("listeners") or []:
        lines.append(
            f"  - {lst.get('name')}: {lst.get('protocol')} "
            f"{lst.get('address')}:{lst.get('port')}, allocations: {lst.get('allocations', NONE)}"
        )
    return "\n".join(lines)


def degraded_summary(reasons: Iterable[str]) -> str:
    return "\n".join(f"  ! {reason}" for reason in reasons)


def unreachable_summary(gateway: str, tried: Iterable[str], reason: str) -> str:
    urls = list(tried)
    where = ", ".join(urls[:3]) or "no address to try"
    if len(urls) > 3:
        where += f" and {len(urls) - 3} more"
    return f"Gateway: {gateway} unreachable: no stunnerd answered ({where}): {reason}"


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of an ascending list (empty lists are the caller's care)."""
    rank = min(max(1, math.ceil(fraction * len(sorted_values))), len(sorted_values))
    return sorted_values[rank - 1]


def probe_summary(result: Mapping[str, Any]) -> str:
    head = f"  - {result['listener']}: {result['protocol']} {result['server']}"
    if result.get("error"):
        return f"{head}: FAIL: {result['error']}"
    verdict = "OK" if result["ok"] else "FAIL: too much loss"
    rtt = (
        f"rtt p50 {result['rtt_p50_ms']:.2f} ms, p99 {result['rtt_p99_ms']:.2f} ms"
        if result["received"]
        else "rtt -"
    )
    return (
        f"{head}: sent {result['sent']}, received {result['received']}, "
        f"loss {result['loss'] * 100:.1f}%, {rtt}: {verdict}"
    )


def dump(docs: list[dict[str, Any]], output: str) -> str:
    if output == "json":
        return "\n".join(json.dumps(d, separators=(",", ":"), sort_keys=True) for d in docs)
    return yaml.safe_dump_all(docs, sort_keys=True).rstrip("\n")
