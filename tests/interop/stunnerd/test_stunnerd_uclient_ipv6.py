"""coturn's turnutils_uclient, a client nobody here wrote, against stunnerd on ::1: IPv6 relays
(`-x`) to an IPv6 peer and dual allocations (`-Z`, ADDITIONAL-ADDRESS-FAMILY) to peers of both
families, echoed by coturn's turnutils_peer listening on 127.0.0.1 and ::1."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ports import free_port, free_udp_tcp_port, ipv6_loopback_available
from support.processes import ServerProcess, which
from support.stunnerd_process import PASSWORD, USER, ManagedStunnerd

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

MESSAGES = 20


if not ipv6_loopback_available():
    pytest.skip("this host has no IPv6 loopback (::1)", allow_module_level=True)


def binary(name: str) -> str:
    found = which(name)
    if found is None:
        pytest.skip(f"{name} (coturn) is not installed")
    return found


@pytest.fixture(scope="module")
def echo_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """turnutils_peer echoing on the same port of 127.0.0.1 and ::1."""
    peer = binary("turnutils_peer")
    port = free_port(socket.SOCK_DGRAM, "::1")
    log = tmp_path_factory.mktemp("peer") / "peer.log"
    proc = ServerProcess([peer, "-L", "127.0.0.1", "-L", "::1", "-p", str(port)], log_path=log)
    try:
        for host in ("127.0.0.1", "::1"):
            wait_for_echo(host, port, proc)
        yield port
    finally:
        proc.stop()


def wait_for_echo(host: str, port: int, proc: ServerProcess, timeout_s: float = 10.0) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    deadline = time.monotonic() + timeout_s
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.settimeout(0.1)
        while time.monotonic() < deadline:
            if not proc.alive():
                pytest.fail(f"turnutils_peer exited: {proc.output()}")
            probe.sendto(b"probe", (host, port))
            try:
                if probe.recv(64) == b"probe":
                    return
            except OSError:
                continue
    pytest.fail(f"turnutils_peer does not echo on {host} port {port}: {proc.output()}")


@pytest.fixture(scope="module")
def dual_stunnerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """stunnerd bound to `::` with a listener advertising ::1 and one advertising 127.0.0.1,
    each also relaying in the other family (STUNNERD_RELAY_ADDRESSES)."""
    ports = {"v6": free_udp_tcp_port(), "dual": free_udp_tcp_port()}
    config = {
        "version": "v1",
        "admin": {"name": "default/dual", "loglevel": "all:INFO"},
        "auth": {"type": "static", "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [
            {"name": "v6", "protocol": "TURN-UDP", "address": "::1", "port": ports["v6"],
             "routes": ["echo"]},
            {"name": "dual", "protocol": "TURN-UDP", "address": "127.0.0.1",
             "port": ports["dual"], "routes": ["echo"]},
        ],
        "clusters": [{"name": "echo", "type": "STATIC", "endpoints": ["127.0.0.1", "::1"]}],
    }  # fmt: skip
    tmp: Path = tmp_path_factory.mktemp("dual")
    server = ManagedStunnerd(
        tmp,
        config,
        "--grace-period",
        "0",
        env={"STUNNERD_BIND_HOST": "::", "STUNNERD_RELAY_ADDRESSES": "::1,127.0.0.1"},
    )
    try:
        server.wait_listeners(2)
        yield ports
    finally:
        server.stop()


def uclient(args: list[str]) -> str:
    done = subprocess.run(
        [binary("turnutils_uclient"), "-u", USER, "-w", PASSWORD, "-n", str(MESSAGES),
         "-m", "2", "-c", "-z", "5", "-l", "100", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done.stdout + done.stderr


def assert_all_echoed(output: str) -> None:
    totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$", output, re.M)
    assert totals, output[-3000:]
    sent, received = map(int, totals[-1])
    assert sent == MESSAGES * 2, output[-3000:]
    assert received == sent, output[-3000:]


def test_uclient_over_ipv6_relays_through_an_ipv6_relay_to_an_ipv6_peer(
    dual_stunnerd: dict[str, int], echo_port: int
) -> None:
    output = uclient(
        ["-v", "-x", "-p", str(dual_stunnerd["v6"]), "-e", "::1", "-r", str(echo_port), "::1"]
    )
    assert_all_echoed(output)
    assert re.search(r"IPv6\. Received relay addr: ::1:\d+", output), output[-3000:]


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1"])
def test_uclient_dual_allocation_reaches_peers_of_both_families(
    dual_stunnerd: dict[str, int], echo_port: int, peer: str
) -> None:
    output = uclient(
        ["-Z", "-p", str(dual_stunnerd["dual"]), "-e", peer, "-r", str(echo_port), "127.0.0.1"]
    )
    assert_all_echoed(output)
    assert "error" not in output.lower(), output[-3000:]


def test_uclient_ipv4_relay_requested_from_the_ipv6_listener(
    dual_stunnerd: dict[str, int], echo_port: int
) -> None:
    """-X asks for REQUESTED-ADDRESS-FAMILY IPv4: the listener on ::1 has 127.0.0.1 as well."""
    output = uclient(
        ["-v", "-X", "-p", str(dual_stunnerd["v6"]), "-e", "127.0.0.1", "-r", str(echo_port), "::1"]
    )
    assert_all_echoed(output)
    assert re.search(r"IPv4\. Received relay addr: 127\.0\.0\.1:\d+", output), output[-3000:]
