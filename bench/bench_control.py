"""Control plane at scale: the bootstrap race of upstream's operator benchmark, and endpoint churn.

Bootstrap (upstream's test/bootstrap_benchmark_test.go, applied at once instead of one combo at a
time): each operator on its own real API server (support.kube_stack.KubeStack for ours, the chart
and our operator as its ServiceAccount; for upstream a second KubeCluster with upstream's CRDs and
its stunner-gateway-operator v1.2.1 run as tests/conformance/sides.py's UpstreamSide runs it). One
GatewayClass and GatewayConfig, then N combos of Namespace, Service, Gateway and UDPRoute applied
by 4 threads as fast as the API server takes them. Converged: the side's CDS serves every combo's
config with its route's cluster and every Gateway says Accepted=True. Printed per side: the time
from the last apply to convergence, the operator's CPU (utime+stime from /proc, its process tree)
from the first apply to convergence, its peak RSS (VmHWM), the operator's writes per combo counted
from the API server's audit log (KubeCluster always keeps one) until it has been quiet for a
while, and then how long one more combo takes in the settled cluster of N.
`BENCH_CONTROL_N` (default "100,300"; 1000 is the full run) gives the Ns, a fresh cluster per side
and N; `BENCH_CONTROL_SIDES` (ours,upstream); `BENCH_CONTROL_TIMEOUT_S` bounds each convergence.

Churn (each side of `BENCH_CONTROL_SIDES`): one Gateway with `BENCH_CHURN_SERVICES` UDPRoutes to
Services of `BENCH_CHURN_ENDPOINTS` endpoints each (EndpointSlices the bench writes by update, as
Kubernetes' EndpointSlice controller does),
`BENCH_CHURN_WATCHERS` WebSocket watchers of the CDS, then `BENCH_CHURN_RATE` EndpointSlice writes
per second for `BENCH_CHURN_SECONDS`; each write puts a numbered address in. Printed: the lag from
a write to a watcher seeing it (p50/p99/max over every write and watcher), the CDS fan-out (first
to last watcher per update, p99, as the bench's watchers see it; and inside the CDS, the bucket
bound of the p99 of its `stunner_cds_fanout_seconds` histogram) and whether any watcher is left on
a stale config once the churn stops. The churn runs once per watch protocol in
`BENCH_CHURN_PROTOCOLS` (default "v2,v1"), on the same stack: v2 watchers offer the
`stunner.cds.v2` subprotocol and get a JSON Patch per change, as our stunnerd does; v1 watchers get
the whole config in each frame, as upstream's stunnerd does. Upstream's operator serves v1 only, so
its side runs the v1 churn alone.

`BENCH_CONTROL_PART=bootstrap|churn|all`. Everything binds 127.0.0.1; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import control_report as cr
from bench.bench_turn import cpu_seconds
from stunner_common.runtime import run as run_loop

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "tests",):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

PART = os.environ.get("BENCH_CONTROL_PART", "all")
COUNTS = cr.parse_counts(os.environ.get("BENCH_CONTROL_N", "100,300"))
SIDES = [s for s in os.environ.get("BENCH_CONTROL_SIDES", "ours,upstream").split(",") if s]
TIMEOUT_S = float(os.environ.get("BENCH_CONTROL_TIMEOUT_S", "300"))
ONE_MORE_TIMEOUT_S = 60.0
APPLY_THREADS = 4
POLL_S = 1.0
WRITES_QUIET_S = 3.0
WRITES_SETTLE_S = 60.0
CONTROLLER = "stunner.l7mp.io/gateway-operator"

CHURN_SERVICES = int(os.environ.get("BENCH_CHURN_SERVICES", "20"))
CHURN_ENDPOINTS = int(os.environ.get("BENCH_CHURN_ENDPOINTS", "50"))
CHURN_RATE = float(os.environ.get("BENCH_CHURN_RATE", "20"))
CHURN_SECONDS = float(os.environ.get("BENCH_CHURN_SECONDS", "30"))
CHURN_WATCHERS = int(os.environ.get("BENCH_CHURN_WATCHERS", "100"))
CHURN_PROTOCOLS = [
    p.strip() for p in os.environ.get("BENCH_CHURN_PROTOCOLS", "v2,v1").split(",") if p.strip()
]
PROTOCOL_NAMES = {
    "v2": "v2 watchers (a JSON Patch per change, as our stunnerd watches)",
    "v1": "v1 watchers (the whole config per change, as upstream's stunnerd watches)",
}
CHURN_NS = "bench-churn"
CHURN_GW = "churn-gw"
SETTLE_TIMEOUT_S = 20.0


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Side:
    """One operator on its own API server: ours (KubeStack) or upstream's (UpstreamSide)."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.workdir = workdir
        self.impl: Any = None

    def start(self) -> None:
        if self.name == "ours":
            from support.kube_stack import KubeStack

            self.impl = KubeStack(self.workdir)
            self.impl.start()
        else:
            from conformance.sides import UpstreamSide

            self.impl = UpstreamSide(self.workdir)
            self.impl.start()
            dataplane = {
                "apiVersion": "stunner.l7mp.io/v1",
                "kind": "Dataplane",
                "metadata": {"name": "default"},
                "spec": {"image": "l7mp/stunnerd:latest", "command": ["stunnerd"], "args": ["-w"]},
            }
            self.impl.admin.apply(dataplane)
        self.admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "stunner"}})

    @property
    def admin(self) -> Any:
        return self.impl.admin

    @property
    def cluster(self) -> Any:
        return self.impl.cluster

    @property
    def operator_pid(self) -> int:
        if self.name == "ours":
            return int(self.impl.operators[0].pid)
        return int(self.impl.operator.pid)

    def cds_configs(self, config_id: str = "") -> dict[str, Any]:
        configs: dict[str, Any] = self.impl.cds_configs(config_id)
        return configs

    def is_operator(self) -> Callable[[Any], bool]:
        if self.name == "ours":
            return cr.user_agent_is((), "system:serviceaccount:stunner:stunner-operator")
        # Upstream runs with the admin kubeconfig, as the controller-manager and the bench do:
        # its requests are told apart by controller-runtime's user agent (the binary's name).
        return cr.user_agent_is(("stunner-gateway-operator", "manager/"), "kubernetes-admin")

    def stop(self) -> None:
        if self.impl is not None:
            self.impl.stop()


def _gateways(side: Side) -> list[dict[str, Any]]:
    data = side.admin.request("GET", "/apis/gateway.networking.k8s.io/v1/gateways")
    items: list[dict[str, Any]] = data.get("items", [])
    return items


def _pending(side: Side, indices: range) -> list[int]:
    try:
        configs = side.cds_configs()
    except Exception:  # the CDS is busy or restarting: nothing counts as served
        configs = {}
    return cr.converged(configs, cr.accepted_gateways(_gateways(side)), indices)


def _one_pending(side: Side, index: int) -> bool:
    """Whether combo ``index`` is not converged yet, asking for its Gateway and its config
    alone (listing a thousand of each per poll would be most of what is measured)."""
    ns = f"{cr.NS_PREFIX}{index}"
    gateway = side.admin.get(
        "gateway.networking.k8s.io/v1", "Gateway", f"{cr.GATEWAY_PREFIX}{index}", ns
    )
    try:
        configs = side.cds_configs(cr.config_id(index))
    except Exception:  # the CDS is busy or restarting: nothing counts as served
        configs = {}
    return bool(cr.converged(configs, cr.accepted_gateways([gateway] if gateway else []), [index]))


def settled_writes(side: Side, since: float) -> cr.Writes:
    """The operator's writes since ``since``, once it has been quiet for WRITES_QUIET_S: it goes
    on writing Deployments, Services and route statuses after the configs are served."""
    last_total, quiet_since = -1, time.monotonic()
    deadline = time.monotonic() + WRITES_SETTLE_S
    writes = cr.Writes()
    while time.monotonic() < deadline:
        with open(side.cluster.audit_log) as log:
            writes = cr.operator_writes(log, side.is_operator(), since)
        if writes.total != last_total:
            last_total, quiet_since = writes.total, time.monotonic()
        elif time.monotonic() - quiet_since >= WRITES_QUIET_S:
            break
        time.sleep(0.5)
    return writes


def bootstrap(side_name: str, n: int, workdir: Path) -> cr.SideResult:
    side = Side(side_name, workdir)
    note = ""
    try:
        side.start()
        pid = side.operator_pid
        for doc in cr.class_objects(CONTROLLER):
            side.admin.apply(doc)
        cpu_before = cpu_seconds(pid)
        first = time.time()
        with ThreadPoolExecutor(APPLY_THREADS) as pool:
            for _ in pool.map(lambda i: [side.admin.apply(d) for d in cr.combo(i)], range(n)):
                pass
        last_apply = time.monotonic()
        deadline = last_apply + TIMEOUT_S
        pending = list(range(n))
        history: list[tuple[float, int]] = []
        while time.monotonic() < deadline:
            pending = _pending(side, range(n))
            history.append((time.monotonic() - last_apply, len(pending)))
            if not pending:
                break
            time.sleep(POLL_S)
        converge_s = time.monotonic() - last_apply
        cpu = cpu_seconds(pid) - cpu_before
        if pending:
            stalled = [t for t, left in history if left == len(pending)]
            note = (
                f"NOT converged in {TIMEOUT_S:.0f} s: {len(pending)} combos left "
                f"(e.g. {pending[:5]}), unchanged since {stalled[0]:.0f} s after the last apply"
            )
        # The N combos' writes first (Deployments, Services, route statuses go on after the
        # configs are served): one more combo is then what a user adds to a settled cluster of N,
        # not a place in the queue behind N combos' writes.
        writes = settled_writes(side, first)
        one_more = float("nan")
        if not pending:
            started = time.monotonic()
            for doc in cr.combo(n):
                side.admin.apply(doc)
            while time.monotonic() - started < ONE_MORE_TIMEOUT_S:
                if not _one_pending(side, n):
                    one_more = time.monotonic() - started
                    break
                time.sleep(0.05)
        rss = peak_rss_mib(pid)
        counted = n
        source = f"audit log, {counted} combos, until {WRITES_QUIET_S:g} s without a write"
        result = cr.SideResult(
            side_name, n, converge_s, len(pending), cpu, rss, one_more, writes, source, note
        )
        result.combos_written = counted
        return result
    finally:
        side.stop()


# --- churn ----------------------------------------------------------------------------------------


def _slice(index: int, addresses: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"churn-svc-{index}-bench",
            "namespace": CHURN_NS,
            "labels": {
                "kubernetes.io/service-name": f"churn-svc-{index}",
                "endpointslice.kubernetes.io/managed-by": "bench.stunner.l7mp.io",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
        "ports": [{"name": "media", "port": 9001, "protocol": "UDP"}],
    }


def churn_objects() -> tuple[list[dict[str, Any]], list[list[str]]]:
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHURN_NS}},
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": CHURN_GW, "namespace": CHURN_NS},
            "spec": {
                "gatewayClassName": cr.CLASS_NAME,
                "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
            },
        },
    ]
    addresses = [
        [f"10.20.{i}.{j + 1}" for j in range(CHURN_ENDPOINTS)] for i in range(CHURN_SERVICES)
    ]
    for i in range(CHURN_SERVICES):
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": f"churn-svc-{i}", "namespace": CHURN_NS},
                "spec": {"ports": [{"name": "media", "port": 9001, "protocol": "UDP"}]},
            }
        )
        docs.append(_slice(i, addresses[i]))
        docs.append(
            {
                "apiVersion": "stunner.l7mp.io/v1",
                "kind": "UDPRoute",
                "metadata": {"name": f"churn-route-{i}", "namespace": CHURN_NS},
                "spec": {
                    "parentRefs": [{"name": CHURN_GW}],
                    "rules": [{"backendRefs": [{"name": f"churn-svc-{i}"}]}],
                },
            }
        )
    return docs, addresses


RECENT_FRAMES = 8
"""Distinct frames whose markers the watchers keep: a few versions of a config are in flight."""


class _Watchers:
    """The CDS watchers: the newest update number each has seen, and when it saw each one."""

    def __init__(self, count: int, writes: dict[int, float]) -> None:
        self.count = count
        self.writes = writes
        self.newest = [-1] * count
        self.frames = [0] * count
        # An array, not a list: twelve million float objects in a list made each full
        # collection of the bench's own garbage collector walk them, a stall of the watchers'
        # loop that grew with every run on the same stack.
        self.lags = array("d")
        self.seen_first: dict[int, float] = {}
        self.seen_last: dict[int, float] = {}
        self.seen_by: dict[int, int] = {}
        self.changed = asyncio.Event()
        self._recent: list[tuple[bytes, int]] = []
        """The newest marker of each of the last few distinct frames: every watcher receives
        the same bytes, and scanning a frame of 10k endpoints costs far more than comparing it
        (comparing two equal frames costs under a third of hashing one)."""

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.changed.clear()
            await self.changed.wait()

    def _marker(self, payload: bytes) -> int:
        for seen, marker in reversed(self._recent):
            if seen == payload:
                return marker
        marker = cr.newest_marker(payload)
        self._recent.append((payload, marker))
        if len(self._recent) > RECENT_FRAMES:
            del self._recent[0]
        return marker

    def on_frame(self, index: int) -> Callable[[bytes], None]:
        def frame(payload: bytes) -> None:
            at = time.perf_counter()
            self.frames[index] += 1
            newest = self._marker(payload)
            for seq in range(self.newest[index] + 1, newest + 1):
                written = self.writes.get(seq)
                if written is not None:
                    self.lags.append(at - written)
                self.seen_first.setdefault(seq, at)
                self.seen_last[seq] = at
                self.seen_by[seq] = self.seen_by.get(seq, 0) + 1
            self.newest[index] = max(self.newest[index], newest)
            self.changed.set()

        return frame


async def _open_watchers(
    port: int, token: str, watchers: _Watchers, protocol: str
) -> list[asyncio.BaseTransport]:
    from bench.bench_cds import _RawWatcher, watcher_source
    from stunner_common.cds.wire import CDS_V2_SUBPROTOCOL

    extra = f"Authorization: Bearer {token}\r\n" if token else ""
    if protocol == "v2":
        extra += f"Sec-WebSocket-Protocol: {CDS_V2_SUBPROTOCOL}\r\n"

    loop = asyncio.get_running_loop()
    path = f"/api/v1/configs/{CHURN_NS}/{CHURN_GW}?watch=true"
    transports: list[asyncio.BaseTransport] = []
    host = f"127.0.0.1:{port}"
    for i in range(watchers.count):
        ready: asyncio.Future[None] = loop.create_future()

        def factory(i: int = i, ready: asyncio.Future[None] = ready) -> _RawWatcher:
            return _RawWatcher(host, path, watchers.on_frame(i), ready, extra)

        transport, _ = await loop.create_connection(
            factory, "127.0.0.1", port, local_addr=(watcher_source(i), 0)
        )
        transports.append(transport)
        async with asyncio.timeout(10):
            await ready
    return transports


async def _churn(
    side: Side, addresses: list[list[str]], protocol: str, first: int
) -> tuple[list[str], int]:
    """One churn run with `protocol` watchers, its writes numbered from `first`; the report
    lines and the next run's first number."""
    stack = side.impl
    writes: dict[int, float] = {}
    watchers = _Watchers(CHURN_WATCHERS, writes)
    watchers.newest = [first - 1] * CHURN_WATCHERS  # an earlier run's numbers are not news
    transports = await _open_watchers(
        stack.cds_port, getattr(stack, "cds_token", ""), watchers, protocol
    )
    ours = side.name == "ours"  # upstream's operator serves no CDS metrics
    scraped = await asyncio.to_thread(_cds_metrics, stack) if ours else {}
    try:
        async with asyncio.timeout(20):
            await watchers.until(lambda: min(watchers.frames) >= 1)
        total = int(CHURN_RATE * CHURN_SECONDS)
        stop = threading.Event()

        def writer() -> float:
            start = time.perf_counter()
            for seq in range(first, first + total):
                if stop.is_set():
                    break
                due = start + (seq - first) / CHURN_RATE
                time.sleep(max(0.0, due - time.perf_counter()))
                service = seq % CHURN_SERVICES
                slot = (seq // CHURN_SERVICES) % CHURN_ENDPOINTS
                addresses[service][slot] = cr.marker_address(seq)
                writes[seq] = time.perf_counter()
                side.admin.replace(_slice(service, addresses[service]))
            return time.perf_counter() - start

        cpu_before = cpu_seconds(side.operator_pid)
        try:
            async with asyncio.timeout(CHURN_SECONDS * 3 + 30):
                took = await asyncio.to_thread(writer)
        finally:
            stop.set()
        operator_cpu = cpu_seconds(side.operator_pid) - cpu_before
        last_write = max(writes.values())
        last_seq = max(writes)
        caught_up = float("nan")
        try:
            async with asyncio.timeout(SETTLE_TIMEOUT_S):
                await watchers.until(lambda: min(watchers.newest) >= last_seq)
            caught_up = max(watchers.seen_last.get(last_seq, last_write), last_write) - last_write
        except TimeoutError:
            pass
        stale = sum(1 for n in watchers.newest if n < last_seq)
        # The CDS closes a watcher with more configs queued than its bound (1013, try again
        # later; one config changing fast never does, its newest change replaces the queued
        # one); a stunnerd reconnects and gets the newest config, these raw watchers do not.
        dropped = sum(1 for transport in transports if transport.is_closing())
        # the served config itself (HTTP) must carry the last write too
        served = str(side.cds_configs().get(f"{CHURN_NS}/{CHURN_GW}", "")).encode()
        served_ok = cr.newest_marker(served.replace(b"'", b'"')) == last_seq
        metrics = await asyncio.to_thread(_cds_metrics, stack) if ours else {}
    finally:
        for transport in transports:
            transport.close()
    inside = cr.bucket_quantile(scraped, metrics, "stunner_cds_fanout_seconds", 0.99) * 1e3
    mode = "v2" if protocol == "v2" else "v1"
    sent = cr.sample_delta(scraped, metrics, "stunner_cds_frames_sent_total", mode=mode)
    direct = cr.sample_delta(scraped, metrics, "stunner_cds_frames_direct_total", mode=mode)
    ms = [lag * 1e3 for lag in watchers.lags]
    fanout = [
        (watchers.seen_last[s] - watchers.seen_first[s]) * 1e3
        for s in watchers.seen_first
        if watchers.seen_by.get(s) == CHURN_WATCHERS
    ]
    who = "our" if ours else f"{side.name}'s"
    lines = [
        f"churn, {who} operator and CDS, {PROTOCOL_NAMES.get(protocol, protocol)}:",
        f"churn: {CHURN_SERVICES} Services x {CHURN_ENDPOINTS} endpoints, {len(writes)} "
        f"EndpointSlice writes in {took:.1f} s (asked {CHURN_RATE:g}/s for {CHURN_SECONDS:g} s), "
        f"{CHURN_WATCHERS} CDS watchers, {sum(watchers.frames)} frames received; the operator "
        f"used {operator_cpu:.1f} s of CPU while the writes ran",
        f"churn lag write -> watcher (ms, {len(ms)} write x watcher pairs): "
        f"p50 {cr.percentile(ms, 0.5):.0f}  p99 {cr.percentile(ms, 0.99):.0f}  "
        f"max {max(ms, default=float('nan')):.0f}",
        f"churn CDS fan-out, first to last watcher per update (ms, {len(fanout)} updates): "
        f"p50 {cr.percentile(fanout, 0.5):.1f}  p99 {cr.percentile(fanout, 0.99):.1f}",
        *(
            [
                f"churn CDS fan-out inside the CDS, a change handed to every watcher "
                f"(stunner_cds_fanout_seconds): p99 <= {inside:g} ms; {direct:.0f} of "
                f"{sent:.0f} frames written straight to the connection, the rest through a "
                f"watcher's queue"
            ]
            if ours
            else []
        ),
        f"churn after the last write: every watcher on it after {caught_up * 1e3:.0f} ms; "
        f"watchers left stale after {SETTLE_TIMEOUT_S:.0f} s: {stale} of {CHURN_WATCHERS} "
        f"({dropped} closed by the CDS as too slow, not reconnected by the bench); "
        f"the CDS serves the last write over HTTP: {'yes' if served_ok else 'NO'}",
    ]
    return lines, first + total


def _cds_metrics(stack: Any) -> cr.Samples:
    import httpx

    response = httpx.get(f"{stack.cds_url}/metrics", timeout=10.0)
    response.raise_for_status()
    return cr.metric_samples(response.text)


def churn(name: str, workdir: Path) -> None:
    """The churn on one side: ours with every protocol of `CHURN_PROTOCOLS`, upstream's with v1
    watchers only (its CDS speaks nothing else)."""
    side = Side(name, workdir)
    protocols = CHURN_PROTOCOLS if name == "ours" else ["v1"]
    try:
        side.start()
        for doc in cr.class_objects(CONTROLLER):
            side.admin.apply(doc)
        docs, addresses = churn_objects()
        for doc in docs:
            side.admin.apply(doc)
        cfg_id = f"{CHURN_NS}/{CHURN_GW}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            cfg = side.cds_configs().get(cfg_id) or {}
            clusters = cfg.get("clusters") or []
            if len(clusters) == CHURN_SERVICES and all(
                len(c.get("endpoints") or []) >= CHURN_ENDPOINTS for c in clusters
            ):
                break
            time.sleep(0.5)
        else:
            print(
                f"churn, {name}: the CDS never served {cfg_id} with {CHURN_SERVICES} full "
                "clusters in 120 s"
            )
            return
        first = 0
        for protocol in protocols:
            lines, first = run_loop(_churn(side, addresses, protocol, first))
            for line in lines:
                print(line)
    finally:
        side.stop()


def main() -> None:
    from support import gobin

    if gobin.go_binary() is None:
        print("bench control: the Go toolchain is not installed (no kube-apiserver); skipped")
        return
    sides = list(SIDES)
    if "upstream" in sides:
        try:
            gobin.upstream_operator()
        except Exception as exc:  # GoBuildError, UnobtainableSourceError, OSError
            print(f"bench control: upstream's operator cannot be built ({exc}); ours alone")
            sides.remove("upstream")
    print(
        "bench control: the machine is 2 shared vCPUs; API server, etcd, controller-manager, "
        "operator, CDS and the bench all share them"
    )
    with tempfile.TemporaryDirectory(prefix="bench-control-") as tmp_name:
        tmp = Path(tmp_name)
        if PART in ("all", "bootstrap"):
            results = []
            for n in COUNTS:
                for name in sides:
                    started = time.monotonic()
                    result = bootstrap(name, n, tmp / f"{name}-{n}")
                    results.append(result)
                    print(
                        f"bootstrap {name} N={n}: converged in {result.converge_s:.1f} s "
                        f"({result.pending} left; {time.monotonic() - started:.0f} s with set-up)",
                        flush=True,
                    )
            for line in cr.report_lines(results):
                print(line)
        if PART in ("all", "churn"):
            for name in sides:
                churn(name, tmp / f"churn-{name}")


if __name__ == "__main__":
    main()
