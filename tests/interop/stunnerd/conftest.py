"""stunnerd interop fixtures: a stunnerd process with every listener kind, a UDP echo peer."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ports import free_port
from support.processes import ServerProcess, which
from support.stunnerd_process import PASSWORD, REALM, SECRET, USER, Stunnerd, start_stunnerd


@pytest.fixture(scope="module")
def stunnerd_static(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stunnerd]:
    server = start_stunnerd(
        tmp_path_factory.mktemp("static"),
        {"type": "static", "realm": REALM, "credentials": {"username": USER, "password": PASSWORD}},
    )
    yield server
    server.proc.stop()


@pytest.fixture
def stunnerd_static_apart(tmp_path: Path) -> Iterator[Stunnerd]:
    """A static-auth stunnerd of one test's own: a client that fails authentication uses up its
    address's budget of failed attempts (docs/limits.md), which would refuse the next tests'
    clients on the same address."""
    server = start_stunnerd(
        tmp_path,
        {"type": "static", "realm": REALM, "credentials": {"username": USER, "password": PASSWORD}},
    )
    yield server
    server.proc.stop()


@pytest.fixture(scope="module")
def stunnerd_ephemeral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stunnerd]:
    server = start_stunnerd(
        tmp_path_factory.mktemp("ephemeral"),
        {"type": "ephemeral", "realm": REALM, "credentials": {"secret": SECRET}},
    )
    yield server
    server.proc.stop()


@pytest.fixture(scope="module")
def udp_echo_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """coturn's turnutils_peer: a UDP echo server on loopback."""
    binary = which("turnutils_peer")
    if binary is None:
        pytest.skip("turnutils_peer (coturn) is not installed")
    for _ in range(20):
        port = free_port(socket.SOCK_DGRAM)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.bind(("127.0.0.1", port + 1))  # the peer also binds port+1
        except OSError:
            continue
        break
    log = tmp_path_factory.mktemp("peer") / "peer.log"
    proc = ServerProcess([binary, "-L", "127.0.0.1", "-p", str(port)], log_path=log)
    try:
        wait_for_echo(port, proc)
        yield port
    finally:
        proc.stop()


def wait_for_echo(port: int, proc: ServerProcess, timeout_s: float = 10.0) -> None:
    """Block until the peer echoes a probe datagram (or fail with its output)."""
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.settimeout(0.1)
        while time.monotonic() < deadline:
            if not proc.alive():
                pytest.fail(f"turnutils_peer exited: {proc.output()}")
            probe.sendto(b"probe", ("127.0.0.1", port))
            try:
                if probe.recv(64) == b"probe":
                    return
            except OSError:
                continue
    pytest.fail(f"turnutils_peer does not echo on port {port}: {proc.output()}")
