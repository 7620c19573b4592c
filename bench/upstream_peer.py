"""Upstream STUNner's stunnerd (Go, v1.2.1, user space) as a third server in the benches.

Built by ``tests/support/gobin.py`` (pinned module, cached outside the work tree); where Go or
the build is unavailable the benches say why and run without it. Upstream takes its config from
a file origin (``-c file://…``) and its readloop threads from ``--udp-thread-num``: the benches
run it with 1 thread and with one per core, as many as our stunnerd would use workers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))


def upstream_stunnerd() -> tuple[str | None, str]:
    """(path of upstream stunnerd, "") or (None, why not)."""
    if shutil.which("go") is None:
        return None, "the Go toolchain is not installed"
    from support import gobin

    try:
        folder = gobin.upstream_stunner()
    except (gobin.GoBuildError, OSError, subprocess.SubprocessError) as exc:
        return None, f"upstream stunnerd could not be built: {str(exc)[-300:]}"
    return str(folder / "stunnerd"), ""


def thread_counts() -> list[int]:
    """Upstream's ``--udp-thread-num`` values to race: 1, and one per core when that is more."""
    cores = os.cpu_count() or 1
    return [1] if cores == 1 else [1, cores]


def label(threads: int) -> str:
    return f"upstream x{threads}"


def argv(binary: str, config: Path, threads: int) -> list[str]:
    return [binary, "-c", f"file://{config}", "--udp-thread-num", str(threads), "-l", "all:WARN"]
