"""Each contract between processes is defined once: in stunner_common.contracts, nowhere else.

import-linter keeps the contracts pure and Redis behind the store modules, but it cannot see a
literal copied into another module; this test reads the source tree for one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONTRACTS = ROOT / "libs/common/src/stunner_common/contracts"
SOURCES = ("libs", "services", "bench", "scripts")

FORBIDDEN = {
    "the node-address placeholder": re.compile(r"__node_address_placeholder"),
    "the pod-address variable": re.compile(r"[\"']\$?STUNNER_ADDR[\"']"),
    "the targetport annotation": re.compile(r"stunner\.l7mp\.io/targetport"),
    "the port-map parser": re.compile(r"def parse_port_map\b"),
    "a Redis key": re.compile(r"[\"']stunner:"),
    "the socket key": re.compile(r"class SocketKey\b|\b(socket_kind|listener_bind_host)\("),
}


def sources() -> dict[str, str]:
    """Every Python file of the source tree outside the contracts: its path -> its text."""
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for top in SOURCES
        for path in sorted((ROOT / top).rglob("*.py"))
        if CONTRACTS not in path.parents and ".venv" not in path.parts
    }


def copies(pattern: re.Pattern[str], files: dict[str, str]) -> list[str]:
    return [
        f"{name}:{number}: {line.strip()}"
        for name, text in files.items()
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


@pytest.mark.parametrize("what", sorted(FORBIDDEN))
def test_no_module_outside_the_contracts_defines_it_again(what: str) -> None:
    found = copies(FORBIDDEN[what], sources())
    assert not found, f"{what} outside stunner_common.contracts:\n" + "\n".join(found)


def test_the_check_finds_a_copy() -> None:
    copy = {
        "copy.py": 'KEY = "stunner:configs"\nADDR = "__node_address_placeholder"\n'
        "class SocketKey:\n    pass\n"
    }
    assert copies(FORBIDDEN["a Redis key"], copy) == ['copy.py:1: KEY = "stunner:configs"']
    assert copies(FORBIDDEN["the node-address placeholder"], copy)
    assert copies(FORBIDDEN["the socket key"], copy)


def test_the_contracts_hold_every_definition() -> None:
    text = "".join(p.read_text(encoding="utf-8") for p in CONTRACTS.glob("*.py"))
    for what, pattern in FORBIDDEN.items():
        assert pattern.search(text), f"{what} is not defined in stunner_common.contracts"
