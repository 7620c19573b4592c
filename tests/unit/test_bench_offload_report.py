"""`bench offload`'s report (bench/offload_report.py) on runs of known figures."""

from __future__ import annotations

from collections import Counter

import pytest

from support.bench_modules import bench_module


def run(server: str, machine_us: float, process_us: float, own: int, kernel: int) -> object:
    """A media run of 1000 echoed messages (2000 packets) with the given figures per packet."""
    report = bench_module("offload_report")
    split = bench_module("cpu_profile").Split(Counter({"own code": own, "send": kernel}), 0)
    return report.Run(
        server,
        "media",
        1000,
        1000,
        machine_us * 2000 / 1e6,
        process_us * 2000 / 1e6,
        1.0,
        2.0,
        process_cpu_s=process_us * 2000 / 1e6,
        profile=split,
    )


def test_user_space_against_coturn_is_split_into_own_code_and_the_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = bench_module("offload_report")
    runs = {
        ("coturn", "media"): [run("coturn", 8.0, 8.0, own=20, kernel=80)],
        ("user space", "media"): [run("user space", 6.0, 6.0, own=10, kernel=90)],
    }
    report.report_profiles(runs)
    out = capsys.readouterr().out
    # own code: 0.6 of 6.0 against 1.6 of 8.0; the floor: 5.4 (our kernel part) against 8.0
    assert "RATIO own_code_per_packet userspace/coturn = 0.38" in out
    assert "RATIO process_cpu_per_packet userspace/coturn = 0.75" in out
    assert "media: floor: the kernel's work in user space's own context alone is 0.68" in out
    assert "media: user space: process CPU 6.00 µs/pkt, own code 0.60 µs/pkt" in out


def test_a_whole_machine_figure_at_or_below_zero_gives_no_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = bench_module("offload_report")
    runs = {
        ("offloaded", "media"): [
            run("offloaded", -0.4, 1.0, 1, 1),
            run("offloaded", 0.5, 1.0, 1, 1),
        ],
        ("ip forward", "media"): [
            run("ip forward", 0.2, 1.0, 1, 1),
            run("ip forward", 1.0, 1.0, 1, 1),
        ],
    }
    report.report_kernel_path(runs, 0)
    out = capsys.readouterr().out
    # the first pair is left out (a negative figure), the second reads 0.5
    assert "RATIO cpu_per_packet offloaded/ipforward = 0.50  (server+softirq: 1.00" in out
    runs[("offloaded", "media")] = [run("offloaded", -0.4, 1.0, 1, 1)]
    report.report_kernel_path(runs, 0)
    assert (
        "offloaded/ipforward = n/a (a figure at or below 0.05 µs per packet)"
        in capsys.readouterr().out
    )


def test_a_run_too_short_for_a_tick_gives_no_ratio_instead_of_failing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A tiny load can end before the server is charged one clock tick: 0 µs per packet."""
    report = bench_module("offload_report")
    runs = {
        ("offloaded", "media"): [run("offloaded", 0.5, 1.0, 1, 1)],
        ("ip forward", "media"): [run("ip forward", 1.0, 0.0, 1, 1)],
    }
    report.report_kernel_path(runs, 0)
    assert "(server+softirq: n/a (a figure at or below 0.05 µs" in capsys.readouterr().out
