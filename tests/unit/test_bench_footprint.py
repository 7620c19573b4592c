"""`bench footprint`'s grouping of the modules an idle stunnerd has imported."""

from __future__ import annotations

from support.bench_modules import bench_module


def test_modules_group_by_top_level_package_and_ours_by_subpackage() -> None:
    footprint = bench_module("bench_footprint")
    names = ["redis", "redis.client", "stunnerd", "stunnerd.net.udp", "stunnerd.net", "json"]
    groups = footprint.group_modules(names)
    assert groups == {"redis": 2, "stunnerd": 1, "stunnerd.net": 2, "json": 1}
