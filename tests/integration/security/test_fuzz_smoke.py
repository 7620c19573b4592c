"""A short coverage-guided run of every fuzz target (the long run is `python -m bench fuzz`).

Each target gets a few thousand atheris inputs in its own process, from the same seeds and with
the same rules as the bench: any uncaught exception fails the test and names the input file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[3]
TARGETS = ["stun", "framer", "dtls", "config", "cds", "manifests"]


@pytest.mark.parametrize("target", TARGETS)
def test_a_short_fuzz_run_finds_no_uncaught_exception(target: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_fuzz", "--runs", "3000", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"fuzz {target}" in done.stdout
    assert "3,000 inputs" in done.stdout, done.stdout
