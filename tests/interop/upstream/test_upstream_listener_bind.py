"""Pins docs/upstream-differences.md ``udp-wildcard-bind``: for the same config (a TURN-UDP
listener on 127.0.0.1) upstream stunnerd binds the wildcard address, ours the named one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.stunnerd_process import ManagedStunnerd
from support.upstream import STATIC, Gateway, UpstreamStunnerd

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(60)]


def udp_bound(port: int) -> set[str]:
    """The local addresses with a UDP socket on ``port`` (/proc/net/udp and udp6); the IPv6
    wildcard shows as ``::``, other IPv6 addresses in /proc's hex."""
    found = set()
    for table in ("udp", "udp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            address, hex_port = line.split()[1].split(":")
            if int(hex_port, 16) != port:
                continue
            if table == "udp":
                found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
            else:
                found.add("::" if int(address, 16) == 0 else address)
    return found


async def test_upstream_binds_udp_listeners_on_the_wildcard_ours_on_the_named_address(
    upstream: Path, tmp_path: Path, gateway: Gateway
) -> None:
    config = gateway.config(STATIC, protocols=("TURN-UDP",))
    port = gateway.ports["TURN-UDP"]
    path = tmp_path / "upstream.json"
    path.write_text(json.dumps(config))
    theirs = UpstreamStunnerd(
        upstream, tmp_path, "-c", f"file://{path}", health_port=gateway.health_port
    )
    try:
        await theirs.wait_status(lambda s: s.get("status") == "READY", "READY")
        assert udp_bound(port) == {"::"}  # the dual-stack wildcard
    finally:
        await theirs.close()
    ours_dir = tmp_path / "ours"
    ours_dir.mkdir()
    ours = ManagedStunnerd(ours_dir, config, "--grace-period", "0")
    try:
        await ours.ready()
        assert udp_bound(port) == {"127.0.0.1"}
    finally:
        await ours.close()
