"""The tests' copy of examples/local with free listener ports (support/local_manifests.py)."""

from __future__ import annotations

from pathlib import Path

from support.local_manifests import copy_local_examples


def test_the_examples_listener_ports_move_in_one_pass(tmp_path: Path) -> None:
    """A UDP port starting with 3479 must not be read as the TCP listener's old port (that
    made a number over 65535, and the operator refused the Gateway)."""
    manifests = copy_local_examples(tmp_path / "m", 34791, 40000)
    lines = (manifests / "gateways.yaml").read_text().splitlines()
    assert [line.strip() for line in lines if "port:" in line] == ["port: 34791", "port: 40000"]
