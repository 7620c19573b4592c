"""OffloadManager without a kernel: what it reports and keeps when the datapath cannot start."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stunnerd.offload.datapath import Datapath
from stunnerd.offload.manager import OffloadManager


def broken(tmp_path: Path) -> OffloadManager:
    return OffloadManager(lambda: Datapath(str(tmp_path / "gone.bpf.o")))


def test_the_default_engine_is_none_and_says_so(tmp_path: Path) -> None:
    assert broken(tmp_path).status() == {
        "engine": "None",
        "active": False,
        "reason": "offload_engine is None",
    }


def test_a_datapath_that_cannot_start_gives_one_warning_and_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = broken(tmp_path)
    with caplog.at_level(logging.WARNING):
        manager.configure("TC", ["eth0"])
        manager.configure("TC", ["eth0"])  # the same config again: no second attempt
    status = manager.status()
    assert status["engine"] == "TC"
    assert status["active"] is False
    assert "gone.bpf.o is missing" in status["reason"]
    assert len([r for r in caplog.records if "offload" in r.getMessage()]) == 1


def test_channels_are_kept_while_inactive_and_forgotten_when_removed(tmp_path: Path) -> None:
    manager = broken(tmp_path)
    manager.configure("TC")
    counts = [0, 0, 0, 0]
    manager.channel_added(
        "l",
        ("10.0.0.1", 4000),
        0x4000,
        ("10.0.1.1", 5000),
        listener_addr=("0.0.0.0", 3478),
        relay_addr=("0.0.0.0", 50000),
        listener_traffic=counts,
        cluster_traffic=counts,
    )
    assert list(manager.channels) == [("l", ("10.0.0.1", 4000), 0x4000)]
    manager.channel_removed("l", ("10.0.0.1", 4000), 0x4000)
    assert manager.channels == {}
    manager.poll()  # nothing to read, nothing counted
    assert counts == [0, 0, 0, 0]


def test_switching_back_to_none_clears_the_reason(tmp_path: Path) -> None:
    manager = broken(tmp_path)
    manager.configure("XDP")
    manager.configure("None")
    assert manager.status()["reason"] == "offload_engine is None"


class RecordingDatapath:
    """Stands in for a loaded program: records the map entries it is given."""

    def __init__(self) -> None:
        self.put_calls: list[object] = []
        self.delete_calls: list[object] = []

    def put(self, entries: object) -> None:
        self.put_calls.append(entries)

    def delete(self, entries: object) -> tuple[None, None]:
        self.delete_calls.append(entries)
        return None, None


@pytest.mark.parametrize(
    ("client", "peer"),
    [
        (("::1", 4000), ("::1", 5000)),  # an IPv6 channel
        (("::ffff:127.0.0.1", 4000), ("127.0.0.1", 5000)),  # an IPv4 client on a socket on ::
        (("127.0.0.1", 4000), ("::1", 5000)),  # a dual allocation's IPv6 peer
    ],
)
def test_channels_involving_ipv6_stay_in_user_space(
    tmp_path: Path, client: tuple[str, int], peer: tuple[str, int]
) -> None:
    """The kernel program is IPv4-only: such channels get no map entries and are relayed by
    the user-space path (the engine's routes are untouched), with no error."""
    manager = broken(tmp_path)
    recorder = RecordingDatapath()
    manager.datapath = recorder  # type: ignore[assignment]
    counts = [0, 0, 0, 0]
    manager.channel_added(
        "l",
        client,
        0x4000,
        peer,
        listener_addr=("::", 3478),
        relay_addr=("::", 50000),
        listener_traffic=counts,
        cluster_traffic=counts,
    )
    assert recorder.put_calls == []
    assert manager.channels[("l", client, 0x4000)].entries is None


def test_a_channel_added_again_on_its_path_keeps_its_entries_and_counts_elsewhere(
    tmp_path: Path,
) -> None:
    """A policy change re-adds every routed channel with its new cluster's counters: the kernel
    entries stay (no delete and put in between, when the kernel would relay nothing)."""
    manager = broken(tmp_path)
    recorder = RecordingDatapath()
    manager.datapath = recorder  # type: ignore[assignment]
    listener_counts, before, after = [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]

    def add(cluster: list[int], relay_port: int = 50000) -> None:
        manager.channel_added(
            "l",
            ("::1", 4000),
            0x4000,
            ("::1", 5000),
            listener_addr=("::", 3478),
            relay_addr=("::", relay_port),
            listener_traffic=listener_counts,
            cluster_traffic=cluster,
        )

    add(before)
    chan = manager.channels[("l", ("::1", 4000), 0x4000)]
    chan.entries = installed = object()  # type: ignore[assignment]  # as if in the maps
    add(after)
    assert manager.channels[("l", ("::1", 4000), 0x4000)] is chan
    assert chan.cluster_traffic is after
    assert (recorder.put_calls, recorder.delete_calls) == ([], [])
    add(after, relay_port=50002)  # another relay socket: the old entries go
    assert recorder.delete_calls == [installed]
