"""What `bench offload` reads beside CPU time: the offload program's own run time, and the
instructions the machine retired, per relayed packet.

- `BpfProbe`: with `kernel.bpf_stats_enabled=1` (set for the bench's duration, put back after),
  the kernel counts each program's runs and the nanoseconds spent in them (`bpftool prog show`:
  run_cnt, run_time_ns). The TC program runs on every datagram of the server's interfaces, so
  its time per relayed packet is all the kernel path's BPF work, helpers included.
- `Instructions`: `perf stat -a -e instructions` over a run's window, where the machine has
  hardware counters (a VM often has none: then it says so). Machine-wide, so the generator's
  and the peer's instructions are in it, the same for every mode.

Both are steadier than CPU time on a shared machine; `python -m bench.bpf_cost` isolates the
program itself.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
TC_PROG = "stunner_tc"


def _progs() -> list[dict[str, Any]]:
    out = subprocess.run(
        ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=False
    )
    try:
        progs: list[dict[str, Any]] = json.loads(out.stdout or "[]")
    except ValueError:
        return []
    return progs


def xlated_insns(prog_id: int) -> int:
    """The program's instructions after the verifier's rewrites (what the JIT compiles)."""
    out = subprocess.run(
        ["bpftool", "-j", "prog", "dump", "xlated", "id", str(prog_id)],
        capture_output=True,
        text=True,
        check=True,
    )
    return sum(1 for item in json.loads(out.stdout) if "disasm" in item)


class BpfProbe:
    """The offload program that `pid` loaded: its run count and run time between samples."""

    def __init__(self) -> None:
        self.prog_id = 0
        self.saved = ""

    def enable(self) -> None:
        try:
            self.saved = STATS_SYSCTL.read_text().strip()
            STATS_SYSCTL.write_text("1")
        except OSError:
            self.saved = ""

    def restore(self) -> None:
        if self.saved:
            with contextlib.suppress(OSError):
                STATS_SYSCTL.write_text(self.saved)

    def find(self, pid: int) -> int:
        """The id of the TC program held by `pid` (bpftool lists holders), else any of ours."""
        candidates = [p for p in _progs() if p.get("name") == TC_PROG]
        mine = [p for p in candidates if any(h.get("pid") == pid for h in p.get("pids", []))]
        chosen = (mine or candidates)[-1:] if candidates else []
        self.prog_id = int(chosen[0]["id"]) if chosen else 0
        return self.prog_id

    def sample(self) -> tuple[int, int]:
        """(run_cnt, run_time_ns) now; zeros without a program."""
        for p in _progs():
            if int(p.get("id", -1)) == self.prog_id:
                return int(p.get("run_cnt", 0)), int(p.get("run_time_ns", 0))
        return 0, 0

    def insns(self) -> int:
        return xlated_insns(self.prog_id) if self.prog_id else 0


class Instructions:
    """Machine-wide retired instructions over a window, where perf can count them."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                ["perf", "stat", "-a", "-x", ",", "-e", "instructions"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError:
            self.proc = None

    def stop(self) -> int | None:
        """The count since `start`, or None where there is no counter."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        try:
            _out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return None
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and "instructions" in fields[2] and fields[0].isdigit():
                return int(fields[0])
        return None
