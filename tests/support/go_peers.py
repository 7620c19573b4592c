"""Build the Go programs the tests use, once, before the tests that need them run.

``python -m support.go_peers NAME...`` (from tests/) builds each named group into the cache
(support.gobin) and prints how long each took; with no name, every group. `.ci/run` builds
``upstream`` before the default suite (its interop tests run upstream's stunnerd) and the rest
in the background while the suite runs, so that no test waits minutes on a compiler inside its
own time limit. A group already built costs nothing.

Groups: ``upstream`` (stunnerd, turncat, stunnerctl), ``kube`` (kube-apiserver,
kube-controller-manager, etcd), ``kwok``, ``node`` (kubelet, kube-proxy, kube-scheduler),
``coredns`` (the real node's cluster DNS), ``helm`` (the real node's Helm client) and
``gwapi-conformance`` (the Gateway API suite).
Upstream's operator is left out: its source may be unobtainable (support.gobin says why).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from support import gobin
from support.node_stack import COREDNS, COREDNS_VERSION

GROUPS: dict[str, Callable[[], Path]] = {
    "upstream": gobin.upstream_stunner,
    "kube": gobin.kube_binaries,
    "kwok": gobin.kwok,
    "node": gobin.node_binaries,
    "coredns": lambda: gobin.install(COREDNS, COREDNS_VERSION, [""]),
    "gwapi-conformance": gobin.gateway_api_conformance,
    "helm": gobin.helm,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.go_peers", description=__doc__)
    parser.add_argument("groups", nargs="*", help=f"of {', '.join(GROUPS)} (default: all)")
    names = parser.parse_args(argv).groups or list(GROUPS)
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}: choose from {', '.join(GROUPS)}")
    if gobin.go_binary() is None:
        print("go is not installed: nothing built", file=sys.stderr)
        return 1
    failed = 0
    for name in names:
        started = time.monotonic()
        try:
            folder = GROUPS[name]()
        except gobin.GoBuildError as exc:
            print(f"{name}: FAILED after {time.monotonic() - started:.0f} s\n{exc}", flush=True)
            failed += 1
            continue
        print(f"{name}: {folder} ({time.monotonic() - started:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
