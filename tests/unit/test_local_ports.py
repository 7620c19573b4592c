"""The local stack's one port allocator (scripts/local_ports.py)."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "local_ports", ROOT / "scripts" / "local_ports.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["local_ports"] = module
    spec.loader.exec_module(module)
    return module


lp = _module()


def test_the_third_stunnerds_health_port_skips_the_auth_service() -> None:
    alloc = lp.PortAllocator(in_use=lambda port, kind: False)
    alloc.reserve("auth service", 8088)
    got = [alloc.allocate(f"stunnerd gw{i} health", 8086) for i in range(4)]
    assert got == [8086, 8087, 8089, 8090]


def test_stunnerd_metrics_never_land_on_the_operators() -> None:
    alloc = lp.PortAllocator(in_use=lambda port, kind: False)
    assert alloc.allocate("operator metrics", 8080) == 8080
    assert alloc.allocate("stunnerd gw metrics", 8080) == 8081


def test_ports_in_use_are_skipped_and_fixed_ones_refused_with_the_fix() -> None:
    taken = {8086, 13478}
    alloc = lp.PortAllocator(in_use=lambda port, kind: port in taken)
    assert alloc.allocate("stunnerd gw health", 8086) == 8087
    with pytest.raises(lp.PortError, match=r"port 13478/tcp \(CDS\) is already in use: move it"):
        alloc.reserve("CDS", 13478, fix="move it with --cds-port")
    alloc.reserve("auth service", 8088)
    with pytest.raises(lp.PortError, match="wanted by both auth service and CDS"):
        alloc.reserve("CDS", 8088)


def test_listener_ports_are_checked_against_the_stack_and_the_system() -> None:
    alloc = lp.PortAllocator(in_use=lambda port, kind: port == 3478 and kind == socket.SOCK_DGRAM)
    alloc.reserve("auth service", 8088)
    assert alloc.claim_check("listener l", 8088, socket.SOCK_STREAM) == (
        "port 8088/tcp (listener l) is the auth service's port"
    )
    assert "in use by another program" in str(
        alloc.claim_check("listener l", 3478, socket.SOCK_DGRAM)
    )
    assert alloc.claim_check("listener l", 8088, socket.SOCK_DGRAM) is None  # UDP is another space


def test_release_frees_one_owners_ports() -> None:
    alloc = lp.PortAllocator(in_use=lambda port, kind: False)
    alloc.allocate("stunnerd a health", 8086)
    alloc.allocate("stunnerd a metrics", 9086)
    alloc.allocate("stunnerd ab health", 8086)
    assert alloc.release("stunnerd a") == [8086, 9086]
    assert alloc.allocate("stunnerd c health", 8086) == 8086


def test_the_real_probe_sees_a_bound_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert lp.port_in_use(port)
        assert lp.PortAllocator().allocate("x", port) != port
