"""``make conformance``: the same manifests through upstream's operator and through ours.

Each case (``tests/conformance/cases/*.yaml``) is applied to a fresh API server running upstream
stunner-gateway-operator v1.2.1, then to another running ours; after each settles, the rendered
stunnerd configs (canonical JSON), the status conditions (type, status, reason) of every
GatewayClass, Gateway and UDPRoute, and the user-relevant fields of the rendered Deployments and
Services are compared. One line per case: ``same``, ``differs (documented)`` with the ids of
docs/upstream-differences.md, or ``differs`` with each undocumented path; then a summary. The exit
status is 1 on any undocumented difference (or a side that could not run), else 0.

    python tests/conformance/run.py [--cases GLOB] [--report FILE] [-v]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from conformance.compare import Difference, diff  # noqa: E402
from conformance.sides import OursSide, Side, UpstreamSide, load_case  # noqa: E402
from support import gobin  # noqa: E402

CASES = HERE / "cases"


def run_side(side: Side, cases: list[Path], verbose: bool) -> dict[str, dict[str, Any]]:
    started = time.monotonic()
    side.start()
    print(f"# {side.name}: up in {time.monotonic() - started:.0f} s", flush=True)
    out: dict[str, dict[str, Any]] = {}
    try:
        for path in cases:
            docs = load_case(path)
            t0 = time.monotonic()
            try:
                side.apply(docs)
                out[path.stem] = side.settle(docs).as_dict()
            except Exception as exc:  # one broken case must not hide the others
                out[path.stem] = {"error": f"{type(exc).__name__}: {exc}"}
                if verbose:
                    traceback.print_exc()
            finally:
                side.clear(docs)
            if verbose:
                print(f"#   {side.name} {path.stem}: {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        if verbose:
            print(side.log_tail(), flush=True)
        side.stop()
    return out


def peers_missing() -> str:
    """Why the Go peers cannot be had here ("" when they can): no Go, or no operator source."""
    if gobin.go_binary() is None:
        return "the Go toolchain is not installed"
    try:
        gobin.upstream_operator()
        gobin.kube_binaries()
    except gobin.GoBuildError as exc:
        return f"a Go peer could not be built: {str(exc)[-500:]}"
    return ""


def verdict(differences: list[Difference]) -> str:
    if not differences:
        return "same"
    undocumented = [d for d in differences if d.documented is None]
    if undocumented:
        return "differs"
    ids = sorted({d.documented.id for d in differences if d.documented})
    return f"differs (documented: {', '.join(ids)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conformance", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="*.yaml", help="glob of case files (default: all)")
    parser.add_argument("--workdir", type=Path, default=Path(".run/conformance"))
    parser.add_argument("--report", type=Path, default=None, help="write the snapshots as JSON")
    parser.add_argument("--replay", type=Path, default=None, help="compare a saved report")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    cases = sorted(CASES.glob(args.cases))
    if not cases:
        print(f"no cases match {args.cases}")
        return 1
    if args.replay:
        saved = json.loads(args.replay.read_text())
        upstream, ours = saved["upstream"], saved["ours"]
    else:
        missing = peers_missing()
        if missing:
            under_ci = os.environ.get("CI") == "true"
            print(f"conformance: {missing}; {'failed (CI must run it)' if under_ci else 'skipped'}")
            return 1 if under_ci else 0
        workdir = args.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        upstream = run_side(UpstreamSide(workdir / f"upstream-{stamp}"), cases, args.verbose)
        ours = run_side(OursSide(workdir / f"ours-{stamp}"), cases, args.verbose)
        report = args.report or workdir / "report.json"
        report.write_text(json.dumps({"upstream": upstream, "ours": ours}, indent=1))
        print(f"# snapshots in {report}")
    counts = {"same": 0, "documented": 0, "differs": 0, "error": 0}
    for path in cases:
        left, right = upstream.get(path.stem, {}), ours.get(path.stem, {})
        if "error" in left or "error" in right:
            counts["error"] += 1
            print(f"{path.stem}: error (upstream: {left.get('error')}; ours: {right.get('error')})")
            continue
        differences = diff(left, right)
        line = verdict(differences)
        counts["same" if line == "same" else "differs" if line == "differs" else "documented"] += 1
        print(f"{path.stem}: {line}")
        for d in differences:
            if d.documented is None or args.verbose:
                print(f"    {d}")
    print(
        f"SUMMARY {len(cases)} cases: {counts['same']} same, {counts['documented']} differ "
        f"(documented), {counts['differs']} differ (undocumented), {counts['error']} errors"
    )
    return 1 if counts["differs"] or counts["error"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
