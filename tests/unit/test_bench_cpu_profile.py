"""`bench offload`'s profile split (bench/cpu_profile.py) on perf script output of known shape.

The samples below are real stacks from a profile of stunnerd and coturn relaying media (trimmed
to the frames that decide): the split must put each under the system call its stack is in, count
the softirq delivery apart, and call a stack with no kernel frame the server's own code.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from support.bench_modules import bench_module

SCRIPT = """\
stunnerd 13556
\t    7f3a1c2d4e10 table_find.isra.0
\t    7f3a1c2d5a20 drain_ready
\t    7f3a1c2d6b30 FastRelay_poll

stunnerd 13556
\tffffffff81e6743b net_rx_action
\tffffffff8136013d handle_softirqs
\tffffffff81360424 __local_bh_enable_ip
\tffffffff81e6383c __dev_queue_xmit
\tffffffff82044de6 udp_sendmsg
\tffffffff81e2cb8f ____sys_sendmsg
\tffffffff81e2fe94 __sys_sendmmsg
\tffffffff81e2ffdd __x64_sys_sendmmsg
\tffffffff821ed511 do_syscall_64
\tffffffff81000130 entry_SYSCALL_64_after_hwframe
\t          10b106 __sendmmsg

stunnerd 13556
\tffffffff82040577 udp_send_skb+0x17
\tffffffff82044de6 udp_sendmsg
\tffffffff81e2a001 __x64_sys_sendto
\tffffffff821ed511 do_syscall_64
\t          10c000 __libc_sendto

turnserver 13545
\tffffffff81e1a000 _copy_to_iter
\tffffffff81e2b000 ____sys_recvmsg
\tffffffff81e2b100 ___sys_recvmsg
\tffffffff821ed511 do_syscall_64
\t          10d000 __libc_recvmsg

stunnerd 13556
\tffffffff81500000 ep_poll
\tffffffff81500100 do_epoll_wait
\tffffffff81500200 __x64_sys_epoll_wait
\t          10e000 epoll_wait

stunnerd 13556
\tffffffff81100000 handle_mm_fault
\tffffffff81100100 asm_exc_page_fault
\t    7f3a1c2d4e10 _PyEval_EvalFrameDefault

stunnerd 13556
\tffffffff81200000 __do_sys_newfstatat
\t          10f000 fstatat64
"""


def test_each_sample_goes_under_its_system_call() -> None:
    split = bench_module("cpu_profile").classify(SCRIPT)
    assert split.samples == 7
    assert dict(split.counts) == {
        "own code": 1,
        "send": 2,
        "receive": 1,
        "poll": 1,
        "other kernel": 2,  # a page fault outside any system call, and fstatat
    }
    assert split.softirq == 1
    assert split.share("send") == pytest.approx(2 / 7)
    assert split.kernel_share == pytest.approx(6 / 7)
    text = split.describe()
    assert "own code 14.3%" in text
    assert "send 28.6%" in text
    assert "in softirq (delivery to the next socket) 14.3% (7 samples)" in text


def test_nothing_sampled_is_an_empty_split() -> None:
    split = bench_module("cpu_profile").classify("")
    assert split.samples == 0
    assert split.share("own code") == 0.0


def test_a_profile_of_a_busy_process_has_its_own_code() -> None:
    """perf itself, where it can sample here: a process spinning in user mode is own code."""
    module = bench_module("cpu_profile")
    why = module.unavailable()
    if why is not None:
        pytest.skip(why)
    spin = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass",
        ]
    )
    profiler = module.Profiler()
    try:
        profiler.start([spin.pid])
        # The spinner outlives the window: on a loaded machine perf may attach late, and a
        # process gone before it attaches leaves nothing to sample.
        time.sleep(3.0)
        split = profiler.stop()
    finally:
        profiler.close()
        if spin.poll() is None:
            spin.kill()
            spin.wait()
    assert split is not None
    assert split.share("own code") > 0.5, split.describe()
