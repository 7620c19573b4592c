"""Coverage-guided fuzzing (atheris) of every parser fed outside bytes: 1,000,000 inputs each.

Targets (`bench/fuzz_targets.py`): the STUN/TURN codec and engine, the TCP/TLS framer, the DTLS
record path, the stunnerd config parser, the CDS wire messages and the operator's manifest loader.
Each runs in its own process, starting from a small corpus of valid inputs; an uncaught exception
stops that target, leaves the input in `.fuzz/crash-*` and fails the run. The report gives the
inputs executed per target and the rate (there is no peer to compare with: the figure that
matters is 0 uncaught exceptions).

    python -m bench fuzz                       # every target, 1,000,000 inputs each
    python -m bench.bench_fuzz --runs 20000 stun config
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.fuzz_targets import TARGETS, seeds

REPO = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("BENCH_FUZZ_RUNS", "1000000"))
MAX_LEN = {"manifests": 4096, "config": 8192, "cds": 8192}
PER_INPUT_TIMEOUT_S = 20
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")


@dataclass(frozen=True, slots=True)
class FuzzResult:
    target: str
    runs: int
    seconds: float
    crashed: bool
    detail: str


def run_target(
    name: str, runs: int, artifacts: Path, time_limit_s: float | None = None
) -> FuzzResult:
    """Fuzz one target in a child process for `runs` inputs (or until `time_limit_s`)."""
    artifacts.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as corpus:
        for i, seed in enumerate(seeds(name)):
            Path(corpus, f"seed-{i}").write_bytes(seed)
        argv = [
            sys.executable,
            "-m",
            "bench.fuzz_targets",
            name,
            f"-runs={runs}",
            f"-max_len={MAX_LEN.get(name, 4096)}",
            f"-timeout={PER_INPUT_TIMEOUT_S}",
            "-rss_limit_mb=3072",
            "-print_final_stats=1",
            f"-artifact_prefix={artifacts}/{name}-",
            corpus,
        ]
        if time_limit_s is not None:
            argv.insert(5, f"-max_total_time={int(time_limit_s)}")
        started = time.monotonic()
        # libFuzzer's progress, readable while it runs; one file per run (runs may overlap)
        log_path = artifacts / f"{name}-{os.getpid()}.log"
        with open(log_path, "w") as log:
            proc = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False)
        seconds = time.monotonic() - started
    out = log_path.read_text(errors="replace")
    done = _DONE.search(out)
    executed = int(done.group(1)) if done else _stat(out, "stat::number_of_executed_units")
    crashed = proc.returncode != 0 or done is None
    detail = ""
    if crashed:
        lines = [ln for ln in out.splitlines() if ln.strip()]
        detail = "\n".join(lines[-40:])
    return FuzzResult(name, executed, seconds, crashed, detail)


def _stat(out: str, key: str) -> int:
    match = re.search(rf"{re.escape(key)}:\s*(\d+)", out)
    return int(match.group(1)) if match else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_fuzz", description=__doc__)
    parser.add_argument("targets", nargs="*", default=sorted(TARGETS))
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args([] if argv is None else argv)
    artifacts = REPO / ".fuzz"
    results = []
    for name in args.targets:
        result = run_target(name, args.runs, artifacts)
        results.append(result)
        rate = result.runs / result.seconds if result.seconds else 0.0
        status = "CRASH" if result.crashed else "ok"
        print(
            f"fuzz {name:<10} {result.runs:>9,} inputs in {result.seconds:7.1f} s "
            f"({rate:,.0f}/s): {status}",
            flush=True,
        )
        if result.crashed:
            print(result.detail, flush=True)
    crashed = [r.target for r in results if r.crashed]
    total = sum(r.runs for r in results)
    print(
        f"fuzz: {total:,} inputs over {len(results)} targets, uncaught exceptions in: "
        f"{', '.join(crashed) or 'none'}"
    )
    if crashed:
        raise SystemExit(f"fuzz targets crashed: {', '.join(crashed)} (inputs in {artifacts})")


if __name__ == "__main__":
    main(sys.argv[1:])
