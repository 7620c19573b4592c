"""`stunnerd --dry-run` (upstream's `-d`): check a config, listeners included, and exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.ports import free_port, free_udp_tcp_port
from support.stunnerd_process import base_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def dry_run(tmp_path: Path, config: dict[str, Any] | str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "stunnerd.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    env = {**os.environ, "STUNNER_ADDR": "", "STUNNERD_NODE_ADDRESS": ""}
    return subprocess.run(
        [sys.executable, "-m", "stunnerd", "--dry-run", "-c", str(path), "--bind", "127.0.0.1"],
        capture_output=True, text=True, timeout=30, env=env, check=False,
    )  # fmt: skip


def test_a_valid_config_is_reported_valid_and_nothing_is_served(tmp_path: Path) -> None:
    done = dry_run(tmp_path, base_config(free_port(), {"udp": free_udp_tcp_port()}))
    assert done.returncode == 0, done.stderr
    assert "dry run: config default/gw is valid: 1 listener(s), 2 cluster(s)" in done.stdout
    assert "ready on port" not in done.stdout


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"address": "__node_address_placeholder"}, "needs the node's address"),
        (
            {"protocol": "TURN-TLS", "cert": "bm90IGEgY2VydA==", "key": "bm90IGEga2V5"},
            "invalid TLS certificate",
        ),
    ],
    ids=["placeholder-without-node-address", "bad-tls-material"],
)
def test_a_listener_that_cannot_start_fails_the_dry_run(
    tmp_path: Path, change: dict[str, str], fragment: str
) -> None:
    config = base_config(free_port(), {"udp": free_udp_tcp_port()})
    config["listeners"][0].update(change)
    done = dry_run(tmp_path, config)
    assert done.returncode == 1
    assert "dry run: config not valid" in done.stderr
    assert fragment in done.stderr


def test_a_malformed_config_fails_the_dry_run(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "{not json")
    assert done.returncode == 1
    assert "dry run: config not valid" in done.stderr
