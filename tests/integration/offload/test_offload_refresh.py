"""The manager works out each channel's way out again every PATH_REFRESH_S: a channel installed
before its neighbours were known gets their MAC addresses (and the veth flag) in the kernel's
map once they are, with the counters it had; an unchanged way is not written again."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from support import netns
from support.netns import CLIENT_IP, PEER_IP, Topology

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = r"""
import json, sys
from stunnerd.offload import manager as m
from stunnerd.offload.maps import Fwd
mgr = m.OffloadManager()
mgr.configure("TC", sys.argv[3:])
mgr.channel_added("l", (sys.argv[1], 40000), 0x4001, (sys.argv[2], 50000),
                  listener_addr=("0.0.0.0", 3478), relay_addr=("0.0.0.0", 49170),
                  listener_traffic=[0] * 4, cluster_traffic=[0] * 4)
(chan,) = mgr.channels.values()
def kernel_flags():
    value = Fwd()
    assert mgr.datapath.chan.lookup(chan.entries.client_key, value)
    return value.flags
puts = []
put = mgr.datapath.put
mgr.datapath.put = lambda entries: (puts.append(1), put(entries))
report = {"before": kernel_flags()}
mgr._paths_checked = 0.0
mgr.poll()
report["unchanged_puts"] = len(puts)
print("resolve", flush=True)
sys.stdin.readline()
mgr._paths_checked = 0.0
mgr.poll()
report["after"] = kernel_flags()
report["puts"] = len(puts)
mgr.close()
print(json.dumps(report), flush=True)
"""


@pytest.fixture
def topo() -> Iterator[Topology]:
    with netns.topology() as t:
        yield t


def test_a_neighbour_resolved_later_reaches_the_kernel_s_entry(topo: Topology) -> None:
    from stunnerd.offload.maps import FWD_HAS_MACS, FWD_PEER_DEV

    ifs = [topo.server_client_if, topo.server_peer_if]
    proc = netns.popen(
        topo,
        topo.server,
        [sys.executable, "-c", SCRIPT, CLIENT_IP, PEER_IP, *ifs],
        stdin=-1,
        stdout=-1,
        stderr=-1,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stdout.readline().strip() == "resolve", proc.stderr
        netns.prime_neighbours(topo)
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {
        "before": 0,
        "unchanged_puts": 0,
        "after": FWD_HAS_MACS | FWD_PEER_DEV,
        "puts": 1,
    }
