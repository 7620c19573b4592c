"""What the in-process microbenchmarks (`bench allocate`, `bench journal`) share: their
`--callgrind` mode, which runs the bench module twice under
`valgrind --tool=callgrind` (K = 0 and K = the prepared count) so that the difference of the
instruction counts over K is the cost of one item."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def instructions(path: Path) -> int:
    """The total instruction count of a callgrind output file."""
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"no totals in {path}")


def run(module: str, out: str, prepare: int, count: int, batch: int) -> str:
    """`python -m module --prepare P --count K --batch B` under callgrind, writing to `out`
    (`%p` in it becomes each process's pid); the run's standard error."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            module,
            "--prepare",
            str(prepare),
            "--count",
            str(count),
            "--batch",
            str(batch),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stderr
