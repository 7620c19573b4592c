"""Where a server's own CPU goes while it relays: a perf sample profile of its processes.

`bench offload` charges each server the CPU of its processes, and that CPU has two parts: the
server's own code (user mode) and the kernel's work in its context (the system calls it makes and
what the kernel runs on their way: on a veth or loopback path, the softirq that delivers each sent
datagram to the next socket and wakes its reader). Every socket-based relay pays the second part
for the same packets; only the first is the server's to make smaller. `Profiler` samples the
server's processes (`perf record -e cpu-clock -g -p PIDS`) over a run's window and `classify`
sorts each sample by the outermost system call on its kernel stack:

- own code: no kernel frame at all;
- send (sendto, sendmsg, sendmmsg, write), receive (recvfrom, recvmsg, recvmmsg, read) and poll
  (epoll_wait, epoll_pwait, poll, select): the system calls of a relay's loop;
- other kernel: any other system call, and interrupts or faults outside one;

and counts apart the samples in softirq (packet delivery run in this process's context). A
cpu-clock sample lands where interrupts were enabled again, so single kernel symbols are blurred;
the split by system call is not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.bench_turn import cpu_seconds

FREQUENCY_HZ = 499
CATEGORIES = ("own code", "send", "receive", "poll", "other kernel")
SEND = frozenset({"sendto", "sendmsg", "sendmmsg", "write", "writev"})
RECEIVE = frozenset({"recvfrom", "recvmsg", "recvmmsg", "read", "readv"})
POLL = frozenset({"epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select"})
SOFTIRQ = frozenset({"handle_softirqs", "__do_softirq", "net_rx_action"})
# __x64_sys_sendto, __arm64_sys_recvmmsg, __sys_sendmmsg, ___sys_recvmsg, __do_sys_poll, ...
SYSCALL = re.compile(r"^_+(?:x64_|arm64_|ia32_|do_)?sys_([a-z0-9_]+)$")
KERNEL_SPACE = 1 << 63  # x86-64 and arm64 kernel (and BPF JIT) addresses


@dataclass
class Split:
    """Sample counts per category, and how many of them ran in softirq."""

    counts: Counter[str] = field(default_factory=Counter)
    softirq: int = 0

    @property
    def samples(self) -> int:
        return sum(self.counts.values())

    def share(self, category: str) -> float:
        return self.counts[category] / max(1, self.samples)

    @property
    def kernel_share(self) -> float:
        return 1.0 - self.share("own code")

    def describe(self) -> str:
        parts = [f"{name} {100 * self.share(name):.1f}%" for name in CATEGORIES]
        return (
            f"{', '.join(parts)}; in softirq (delivery to the next socket) "
            f"{100 * self.softirq / max(1, self.samples):.1f}% ({self.samples} samples)"
        )


def _category(frames: list[tuple[int, str]]) -> str:
    if not any(ip >= KERNEL_SPACE for ip, _sym in frames):
        return "own code"
    for _ip, sym in reversed(frames):  # outermost first: the system call, not what it calls
        match = SYSCALL.match(sym)
        if match is None:
            continue
        name = match.group(1)
        if name in SEND:
            return "send"
        if name in RECEIVE:
            return "receive"
        if name in POLL:
            return "poll"
        return "other kernel"
    return "other kernel"


def classify(script: str) -> Split:
    """The split of `perf script -F comm,tid,ip,sym` output: one sample per blank-line-separated
    block, a header line, then one `ip symbol` line per frame, innermost first."""
    split = Split()
    for block in script.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        frames = []
        for line in lines[1:]:
            parts = line.split()
            try:
                ip = int(parts[0], 16)
            except (IndexError, ValueError):
                continue
            sym = parts[1].split("+", 1)[0] if len(parts) > 1 else "[unknown]"
            frames.append((ip, sym))
        split.counts[_category(frames)] += 1
        if any(sym in SOFTIRQ for _ip, sym in frames):
            split.softirq += 1
    return split


def unavailable() -> str | None:
    """Why perf cannot sample here, or None."""
    if shutil.which("perf") is None:
        return "perf is not installed"
    probe = subprocess.run(
        ["perf", "record", "-q", "-e", "cpu-clock", "-o", os.devnull, "--", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"perf record fails: {(probe.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


class Profiler:
    """`perf record` of some processes between `start` and `stop`; does nothing without perf."""

    def __init__(self) -> None:
        self.why_not = unavailable()
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = tempfile.TemporaryDirectory(prefix="bench-profile-")
        self.data = Path(self.dir.name) / "perf.data"

    def start(self, pids: list[int]) -> None:
        if self.why_not is not None or not pids:
            return
        argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQUENCY_HZ), "-g"]
        argv += ["-o", str(self.data), "-p", ",".join(map(str, pids))]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def cpu_s(self) -> float:
        """perf's own CPU so far (the bench takes it out of the machine's figure)."""
        return cpu_seconds(self.proc.pid) if self.proc is not None else 0.0

    def stop(self) -> Split | None:
        """The split of what was sampled since `start`, or None where nothing was."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
        script = subprocess.run(
            ["perf", "script", "-i", str(self.data), "-F", "comm,tid,ip,sym"],
            capture_output=True,
            text=True,
            check=False,
        )
        self.data.unlink(missing_ok=True)
        split = classify(script.stdout)
        return split if split.samples else None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()
