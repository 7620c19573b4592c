"""Which entries the TC program hands straight to a veth's far end (`bpf_redirect_peer`): those
whose egress is a veth with its other end in another namespace, once the MACs are resolved."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from support import netns
from support.netns import CLIENT_IP, PEER_IP, Topology

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PEER_DEVICES = r"""
import json, socket
from stunnerd.offload.routes import peer_in_other_namespace
print(json.dumps({name: peer_in_other_namespace(i) for i, name in socket.if_nameindex()}))
"""

ENTRY_FLAGS = r"""
import json, sys
from stunnerd.offload.datapath import channel_entries
e = channel_entries((sys.argv[1], 40000), ("0.0.0.0", 3478), 0x4001, (sys.argv[2], 50000),
                    ("0.0.0.0", 49170))
print(json.dumps([e.to_peer.flags, e.to_client.flags]))
"""


@pytest.fixture
def topo() -> Iterator[Topology]:
    with netns.topology() as t:
        yield t


def _peer_devices(topo: Topology) -> dict[str, bool]:
    done = topo.run(topo.server, sys.executable, "-c", PEER_DEVICES)
    assert done.returncode == 0, done.stderr
    answer: dict[str, bool] = json.loads(done.stdout)
    return answer


def test_a_veth_to_another_namespace_is_a_peer_device_and_lo_is_not(topo: Topology) -> None:
    found = _peer_devices(topo)
    assert found[topo.server_client_if] is True
    assert found[topo.server_peer_if] is True
    assert found["lo"] is False


def test_a_veth_pair_within_one_namespace_is_not_a_peer_device(topo: Topology) -> None:
    topo.run(topo.server, "ip", "link", "add", "inner-a", "type", "veth", "peer", "name", "inner-b")
    found = _peer_devices(topo)
    assert found["inner-a"] is False
    assert found["inner-b"] is False


def test_entries_carry_the_peer_device_flag_once_the_macs_are_known(topo: Topology) -> None:
    from stunnerd.offload.maps import FWD_HAS_MACS, FWD_PEER_DEV

    def flags() -> list[int]:
        done = topo.run(topo.server, sys.executable, "-c", ENTRY_FLAGS, CLIENT_IP, PEER_IP)
        assert done.returncode == 0, done.stderr
        answer: list[int] = json.loads(done.stdout)
        return answer

    assert flags() == [0, 0]  # nothing resolved yet: bpf_redirect_neigh
    netns.prime_neighbours(topo)
    assert flags() == [FWD_HAS_MACS | FWD_PEER_DEV] * 2
