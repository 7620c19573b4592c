"""Run every benchmark module (`bench/bench_*.py`) in turn, or those named on the command line.

The long runs (`fuzz`: a million inputs per target; `soak`: ten minutes of churn) take hours
together on a small machine, so they run only when named (`make fuzz`, `make soak`).

Each module exposes `main() -> None`, which prints its own report: the ratio against a peer
measured in the same run (usually coturn), never a timed assertion. `make bench` runs this.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

LONG_RUNS = frozenset({"fuzz", "soak"})


def discover() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))


def default_names() -> list[str]:
    return [name for name in discover() if name not in LONG_RUNS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        help=f"benchmarks (default: {default_names()}; only when named: {sorted(LONG_RUNS)})",
    )
    args = parser.parse_args(argv)
    names = args.names or default_names()
    failed = []
    for name in names:
        print(f"\n=== bench {name} ===", flush=True)
        started = time.monotonic()
        try:
            importlib.import_module(f"bench.bench_{name}").main()
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"=== {name}: {time.monotonic() - started:.1f} s ===", flush=True)
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
