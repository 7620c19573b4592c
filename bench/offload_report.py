"""The table and the ratios `bench offload` prints from its runs (see bench/bench_offload.py)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.cpu_profile import Split

SERVERS = ("coturn", "user space", "offloaded")
OUR_MODES = ("user space", "python", "offloaded")
FORWARD = "ip forward"


@dataclass
class Run:
    server: str
    load: str
    sent: int
    echoed: int
    machine_cpu_s: float  # whole machine minus generator, peer and other tenants
    server_cpu_s: float  # the server's processes + all irq/softirq
    rtt_p50_ms: float
    rtt_p99_ms: float
    bpf_ns: int = 0  # the offload program's run time over the window
    bpf_runs: int = 0
    instructions: int | None = None  # machine-wide, where there are hardware counters
    process_cpu_s: float = 0.0  # the server's processes alone
    profile: Split | None = None  # where that CPU went (bench/cpu_profile.py), where perf works

    @property
    def packets(self) -> int:
        return 2 * self.echoed

    @property
    def loss_pct(self) -> float:
        return 100.0 * (self.sent - self.echoed) / max(1, self.sent)

    @property
    def us_per_packet(self) -> float:
        return self.machine_cpu_s * 1e6 / max(1, self.packets)

    @property
    def server_us_per_packet(self) -> float:
        return self.server_cpu_s * 1e6 / max(1, self.packets)

    @property
    def process_us_per_packet(self) -> float:
        return self.process_cpu_s * 1e6 / max(1, self.packets)

    @property
    def own_us_per_packet(self) -> float | None:
        """The server's own code (user mode) per relayed packet, by the profile's share."""
        if self.profile is None:
            return None
        return self.process_us_per_packet * self.profile.share("own code")

    @property
    def kernel_us_per_packet(self) -> float | None:
        """The kernel's work in the server's processes per relayed packet, by the profile."""
        if self.profile is None:
            return None
        return self.process_us_per_packet * self.profile.kernel_share

    @property
    def insns_per_packet(self) -> float | None:
        return None if self.instructions is None else self.instructions / max(1, self.packets)


Runs = dict[tuple[str, str], list[Run]]


# The whole-machine figure subtracts the generator's and the peer's CPU, which carries softirq
# work too (tick accounting): for the kernel paths it can come out at or below zero, where a
# ratio means nothing.
RESOLUTION_US = 0.05


def _ratio_span(numerators: list[float], denominators: list[float]) -> str:
    """The span of pairwise ratios, leaving out pairs with a figure at or below the resolution."""
    ratios = [
        a / b
        for a, b in zip(numerators, denominators, strict=False)
        if a > RESOLUTION_US and b > RESOLUTION_US
    ]
    if not ratios:
        return f"n/a (a figure at or below {RESOLUTION_US} µs per packet)"
    return _span(ratios)


def _span(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"


def report_kernel_path(runs: Runs, bpf_insns: int) -> None:
    """Offloaded against IP forwarding, the BPF program's share, and instructions per packet."""
    for load in ("media", "flood"):
        prefix = "" if load == "media" else "flood "
        offl, fwd = runs.get(("offloaded", load)), runs.get((FORWARD, load))
        if offl and fwd:
            ratios = _ratio_span([a.us_per_packet for a in offl], [b.us_per_packet for b in fwd])
            srv = _ratio_span(
                [a.server_us_per_packet for a in offl], [b.server_us_per_packet for b in fwd]
            )
            print(
                f"RATIO {prefix}cpu_per_packet offloaded/ipforward = {ratios}  "
                f"(server+softirq: {srv})"
            )
        if offl:
            ns = [r.bpf_ns / max(1, r.packets) for r in offl]
            runs_per = [r.bpf_runs / max(1, r.packets) for r in offl]
            print(
                f"{load}: offloaded: BPF program {_span(ns)} ns per relayed packet "
                f"({_span(runs_per)} runs each; {bpf_insns} instructions xlated)"
            )
        _instructions(runs, load)


def _instructions(runs: Runs, load: str) -> None:
    """Machine-wide instructions per relayed packet for each mode, where perf counted them."""
    counted = {
        name: [c for c in (r.insns_per_packet for r in series) if c is not None]
        for (name, each), series in runs.items()
        if each == load
    }
    if not any(counted.values()):
        print(
            f"{load}: instructions per relayed packet: no hardware counter here (the C fast "
            "path's own: `python -m bench fastpath`, callgrind)"
        )
        return
    for name, counts in counted.items():
        shown = _span(counts) if counts else "n/a"
        print(f"{load}: {name}: instructions per relayed packet (machine) {shown}")


def _coturn_ratios(runs: Runs, load: str, prefix: str) -> None:
    base = [r.us_per_packet for r in runs[("coturn", load)]]
    base_srv = [r.server_us_per_packet for r in runs[("coturn", load)]]
    names = [("offloaded", "offloaded"), ("user space", "userspace"), ("python", "python")]
    names += [(n, n.replace(" ", "")) for n, _ in runs if n.startswith("upstream") and _ == load]
    names.append((FORWARD, "ipforward"))
    for name, label in names:
        if (name, load) not in runs:
            continue
        series = runs[(name, load)]
        ratios = _ratio_span([r.us_per_packet for r in series], base)
        srv = _ratio_span([r.server_us_per_packet for r in series], base_srv)
        line = f"RATIO {prefix}cpu_per_packet {label}/coturn = {ratios}"
        if name == FORWARD:
            line = "reference: " + line.removeprefix("RATIO ")
        print(f"{line}  (server+softirq: {srv})")


def _upstream_ratios(runs: Runs, load: str, prefix: str, upstreams: list[str]) -> None:
    for ours in OUR_MODES:
        for theirs in upstreams:
            if (ours, load) not in runs or (theirs, load) not in runs:
                continue
            ratios = _ratio_span(
                [a.us_per_packet for a in runs[(ours, load)]],
                [b.us_per_packet for b in runs[(theirs, load)]],
            )
            print(
                f"RATIO {prefix}cpu_per_packet ours/upstream = {ratios}  "
                f"(ours: {ours}; upstream: stunnerd v1.2.1 --udp-thread-num "
                f"{theirs.removeprefix('upstream x')})"
            )


def _merged(series: list[Run]) -> Split | None:
    profiles = [r.profile for r in series if r.profile is not None]
    if not profiles:
        return None
    merged = Split()
    for split in profiles:
        merged.counts.update(split.counts)
        merged.softirq += split.softirq
    return merged


def report_profiles(runs: Runs) -> None:
    """Each server's process CPU per packet, split into its own code and the kernel's work in its
    context, and what that split leaves for user space against coturn."""
    for load in ("media", "flood"):
        prefix = "" if load == "media" else "flood "
        for (name, each), series in runs.items():
            merged = _merged(series)
            if each != load or merged is None:
                continue
            own_us = [r.own_us_per_packet for r in series if r.own_us_per_packet is not None]
            print(
                f"{load}: {name}: process CPU {_span([r.process_us_per_packet for r in series])} "
                f"µs/pkt, own code {_span(own_us)} µs/pkt; by system call: {merged.describe()}"
            )
        ours, base = runs.get(("user space", load)), runs.get(("coturn", load))
        if not ours or not base or any(r.profile is None for r in (*ours, *base)):
            continue
        own = _ratio_span(
            [a.own_us_per_packet or 0.0 for a in ours], [b.own_us_per_packet or 0.0 for b in base]
        )
        proc = _ratio_span(
            [a.process_us_per_packet for a in ours], [b.process_us_per_packet for b in base]
        )
        floor = _ratio_span(
            [a.kernel_us_per_packet or 0.0 for a in ours], [b.process_us_per_packet for b in base]
        )
        print(f"RATIO {prefix}own_code_per_packet userspace/coturn = {own}")
        print(f"RATIO {prefix}process_cpu_per_packet userspace/coturn = {proc}")
        print(
            f"{load}: floor: the kernel's work in user space's own context alone is "
            f"{floor} of coturn's whole process CPU (the ratio with no own code at all)"
        )


def report(runs: Runs, bpf_insns: int = 0) -> None:
    print(
        f"{'server':<11} {'load':<6} {'sent':>8} {'echoed':>8} {'loss %':>7} {'µs/pkt':>7} "
        f"{'server+softirq µs/pkt':>21} {'RTT p50 ms':>10} {'p99 ms':>8}"
    )
    for (name, load), series in runs.items():
        for r in series:
            print(
                f"{name:<11} {load:<6} {r.sent:>8} {r.echoed:>8} {r.loss_pct:>7.3f} "
                f"{r.us_per_packet:>7.2f} {r.server_us_per_packet:>21.2f} "
                f"{r.rtt_p50_ms:>10.3f} {r.rtt_p99_ms:>8.3f}"
            )
    upstreams = sorted({n for n, _ in runs if n.startswith("upstream")})
    for load in ("media", "flood"):
        prefix = "" if load == "media" else "flood "
        if any((name, load) not in runs for name in SERVERS):
            print(f"{load}: not every server completed a run; no ratio to coturn")
        else:
            _coturn_ratios(runs, load, prefix)
        _upstream_ratios(runs, load, prefix, upstreams)
        for name in (*SERVERS, "python", *upstreams, FORWARD):
            if (name, load) not in runs:
                continue
            series = runs[(name, load)]
            print(
                f"{load}: {name}: loss {_span([r.loss_pct for r in series])} %, "
                f"RTT p50 {_span([r.rtt_p50_ms for r in series])} ms "
                f"p99 {_span([r.rtt_p99_ms for r in series])} ms"
            )
    report_kernel_path(runs, bpf_insns)
    report_profiles(runs)
