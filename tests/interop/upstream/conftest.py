"""Fixtures of the upstream interop tests: the built upstream binaries, a gateway on free ports,
an independent UDP echo peer."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from support import gobin
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, which
from support.upstream import Gateway, OurCds, our_cds, upstream_bin


@pytest.fixture(scope="session")
def upstream() -> Path:
    """The folder with upstream stunnerd, turncat and stunnerctl v1.2.1."""
    return upstream_bin()


@pytest.fixture
async def cds(tmp_path: Path) -> AsyncIterator[OurCds]:
    """Our CDS on a real Redis, for upstream's clients to read."""
    async with our_cds(tmp_path) as stack:
        yield stack


@pytest.fixture
def gateway() -> Gateway:
    return Gateway.on_free_ports()


@pytest.fixture
def echo_peer(tmp_path: Path) -> Iterator[int]:
    """coturn's turnutils_peer: an independent UDP echo server on loopback."""
    binary = which("turnutils_peer")
    if binary is None:
        pytest.skip("turnutils_peer (coturn) is not installed")
    for _ in range(20):
        port = free_port(socket.SOCK_DGRAM)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.bind((LOOPBACK, port + 1))  # the peer binds port+1 too
        except OSError:
            continue
        break
    proc = ServerProcess([binary, "-L", LOOPBACK, "-p", str(port)], log_path=tmp_path / "peer.log")
    try:
        deadline = time.monotonic() + 10
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.settimeout(0.1)
            while True:
                assert proc.alive(), proc.output()
                assert time.monotonic() < deadline, proc.output()
                probe.sendto(b"probe", (LOOPBACK, port))
                try:
                    if probe.recv(64) == b"probe":
                        break
                except OSError:
                    continue
        yield port
    finally:
        proc.stop()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the Go peers before the first test runs, outside any test's timeout: from a cold
    cache that takes minutes (docs/upstream-differences.md), longer than a test may run."""
    here = Path(__file__).resolve().parent
    selected = [item for item in session.items if here in Path(str(item.fspath)).parents]
    if not selected or gobin.go_binary() is None:
        return
    with contextlib.suppress(gobin.GoBuildError):  # the fixtures report it, skip or fail
        gobin.upstream_stunner()
        if any("upstream_operator" in getattr(item, "fixturenames", ()) for item in selected):
            gobin.upstream_operator()
            gobin.kube_binaries()
