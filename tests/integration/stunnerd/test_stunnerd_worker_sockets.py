"""The supervisor's SO_REUSEPORT groups and the Unix socket that hands them to workers."""

from __future__ import annotations

import socket

import pytest

from stunner_common.contracts.socket_key import SocketKey
from stunner_common.contracts.worker_messages import NonceKey
from stunnerd.workers.sockets import FdChannel, InheritedSockets, SocketGroups, send_sockets

pytestmark = pytest.mark.integration


def test_a_group_binds_one_socket_per_worker_on_one_port_even_for_port_zero() -> None:
    groups = SocketGroups(3)
    key = SocketKey("udp", "127.0.0.1", 0)
    try:
        groups.bind([key])
        ports = {s.getsockname()[1] for s in groups.groups[key]}
        assert len(groups.groups[key]) == 3
        assert ports == {groups.port(key)}
    finally:
        groups.close()
    assert groups.groups == {}


def test_a_port_held_by_another_process_fails_the_whole_group_with_its_address() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.bind(("127.0.0.1", 0))  # no SO_REUSEPORT: nobody may join
        port = other.getsockname()[1]
        groups = SocketGroups(2)
        with pytest.raises(OSError, match=f"cannot bind UDP 127.0.0.1:{port}"):
            groups.bind([SocketKey("udp", "127.0.0.1", port)])
        assert groups.groups == {}


def test_retain_closes_the_groups_of_listeners_no_longer_configured() -> None:
    groups = SocketGroups(2)
    keep, drop = SocketKey("udp", "127.0.0.1", 0), SocketKey("tcp", "127.0.0.1", 0)
    groups.bind([keep, drop])
    dropped = list(groups.groups[drop])
    groups.retain([keep])
    try:
        assert set(groups.groups) == {keep}
        assert all(s.fileno() == -1 for s in dropped)
    finally:
        groups.close()


def test_a_worker_gets_the_nonce_key_and_a_socket_that_receives_on_the_group_port() -> None:
    groups = SocketGroups(1)
    key = SocketKey("udp", "127.0.0.1", 0)
    ours, theirs = FdChannel.pair()
    worker = InheritedSockets(FdChannel(theirs))
    try:
        groups.bind([key])
        ours.send(NonceKey(b"\xab" * 32))
        send_sockets(ours, groups.of_worker(0, [key]))
        assert worker.wait_nonce_key() == b"\xab" * 32
        worker.drain()
        served = worker.take(key)
        assert served is not None
        with served, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.sendto(b"hello", ("127.0.0.1", groups.port(key)))
            served.settimeout(2.0)
            assert served.recv(100) == b"hello"
        assert worker.take(SocketKey("udp", "127.0.0.1", 1)) is None
        worker.retain([])
        assert worker.take(key) is None
    finally:
        worker.close()
        ours.close()
        groups.close()


def test_a_closed_supervisor_end_is_an_error_for_the_worker() -> None:
    ours, theirs = FdChannel.pair()
    worker = InheritedSockets(FdChannel(theirs))
    ours.close()
    with pytest.raises(ConnectionError):
        worker.wait_nonce_key()
    worker.close()
