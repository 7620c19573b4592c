"""The host-side state a one-node cluster changes, recorded before and undone after.

A kubelet, containerd's CRI, the CNI plugins and kube-proxy change the machine: a bridge with the
pod network's gateway, iptables chains (KUBE-*, CNI-*), network namespaces under /run/netns,
cgroups (kubepods), mounts under the kubelet's root and a few sysctls (the kubelet's kernel
tunables, the bridge plugin's ip_forward). ``HostSnapshot`` records what was there before the
stack started, as plain JSON, so that ``python -m support.node_stack down`` in another process
can remove exactly what was added and put the sysctls back.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle", "raw")
# Chains the node's components add; the stack's own egress guard is in NODE_CHAIN.
OWNED_CHAIN = re.compile(r"^(KUBE-|CNI-|STUNNODE-)")
NODE_CHAIN = "STUNNODE-FORWARD"
# What the kubelet (setupKernelTunables), the bridge plugin and kube-proxy may set.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/run/netns")
CNI_RESULTS = Path("/var/lib/cni/results")


class HostStateError(RuntimeError):
    """The machine is not in a state the stack can start in (e.g. its bridge already exists)."""


def run(*argv: str, check: bool = True, input_text: str | None = None) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, check=False, input=input_text, timeout=60
    )
    if check and done.returncode != 0:
        raise HostStateError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def iptables_chains(cmd: str) -> dict[str, list[str]]:
    """Chain names per table, from ``<cmd>-save``."""
    chains: dict[str, list[str]] = {}
    table = ""
    for line in run(f"{cmd}-save", check=False).splitlines():
        if line.startswith("*"):
            table = line[1:]
            chains.setdefault(table, [])
        elif line.startswith(":"):
            chains.setdefault(table, []).append(line[1:].split()[0])
    return chains


def nft_tables() -> list[str]:
    """``family name`` of every nf_tables table (empty where nft is not installed)."""
    if shutil.which("nft") is None:
        return []
    lines = run("nft", "list", "tables", check=False).splitlines()
    return sorted(" ".join(line.split()[1:3]) for line in lines if line.startswith("table "))


def _sysctl(name: str) -> str | None:
    try:
        return (Path("/proc/sys") / name).read_text().strip()
    except OSError:
        return None


def _cgroup_dirs() -> list[str]:
    return sorted(str(p) for p in CGROUP_ROOT.glob("*/kubepods*"))


def _netns() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.glob("*")) if NETNS_DIR.is_dir() else []


@dataclass
class HostSnapshot:
    """What was on the machine before the stack started (JSON in the stack's state file)."""

    chains: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    sysctls: dict[str, str] = field(default_factory=dict)
    cgroups: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    nft_tables: list[str] = field(default_factory=list)
    cni_state: bool = False
    """Whether /var/lib/cni existed (libcni makes it for its result cache)."""

    @classmethod
    def take(cls) -> HostSnapshot:
        return cls(
            cni_state=CNI_RESULTS.parent.exists(),
            nft_tables=nft_tables(),
            chains={cmd: iptables_chains(cmd) for cmd in IPTABLES},
            sysctls={k: v for k in SYSCTLS if (v := _sysctl(k)) is not None},
            cgroups=_cgroup_dirs(),
            netns=_netns(),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostSnapshot:
        return cls(**data)

    # -- undo

    def new_cgroups(self) -> list[str]:
        before = set(self.cgroups)
        return [d for d in _cgroup_dirs() if d not in before]

    def kill_cgroup_processes(self) -> list[int]:
        """SIGKILL every process in the cgroups the kubelet made (containers left behind)."""
        killed: set[int] = set()
        for top in self.new_cgroups():
            for directory in _subtree(top):
                with contextlib.suppress(OSError):
                    for pid in (directory / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                            killed.add(int(pid))
        return sorted(killed)

    def remove_cgroups(self) -> list[str]:
        """rmdir the kubelet's cgroups, deepest first; returns those that would not go."""
        stuck = []
        for top in self.new_cgroups():
            for d in sorted(_subtree(top)[1:], key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    d.rmdir()
            for _ in range(20):
                try:
                    Path(top).rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                stuck.append(top)
        return stuck

    def remove_netns(self, owned: list[str]) -> list[str]:
        """The network namespaces (under /run/netns) of our containerd's sandboxes that are
        still there: CRI removes each when its sandbox stops, so only a crash leaves one."""
        before = set(self.netns)
        removed = []
        for name in _netns():
            if name in before or name not in owned:
                continue
            path = NETNS_DIR / name
            run("umount", str(path), check=False)
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(name)
        return removed

    def remove_chains(self) -> list[str]:
        """Delete the KUBE-*/CNI-*/STUNNODE-* chains that were not there, and the jumps to them."""
        removed = []
        for cmd in IPTABLES:
            before = self.chains.get(cmd, {})
            dump = run(f"{cmd}-save", check=False)
            table = ""
            new: dict[str, set[str]] = {}
            for line in dump.splitlines():
                if line.startswith("*"):
                    table = line[1:]
                elif line.startswith(":"):
                    chain = line[1:].split()[0]
                    if OWNED_CHAIN.match(chain) and chain not in before.get(table, []):
                        new.setdefault(table, set()).add(chain)
            if not new:
                continue
            script: list[str] = []
            table = ""
            for line in dump.splitlines():
                if line.startswith("*"):
                    if table in new:
                        script.append("COMMIT")
                    table = line[1:]
                    if table in new:
                        script.append(line)
                elif line.startswith("-A ") and table in new:
                    parts = line.split()
                    chain = parts[1]
                    target = parts[parts.index("-j") + 1] if "-j" in parts else ""
                    if chain not in new[table] and target in new[table]:
                        script.append("-D" + line[2:])
            if table in new:
                script.append("COMMIT")
            # Flush all before deleting any: the new chains jump to one another.
            restore: list[str] = []
            for tbl, chains in new.items():
                restore.append(f"*{tbl}")
                restore += [f"-F {c}" for c in sorted(chains)]
                restore += [f"-X {c}" for c in sorted(chains)]
                restore.append("COMMIT")
            if script:
                run(f"{cmd}-restore", "--noflush", input_text="\n".join(script) + "\n")
            run(f"{cmd}-restore", "--noflush", input_text="\n".join(restore) + "\n")
            removed += [f"{cmd} {t} {c}" for t, cs in new.items() for c in sorted(cs)]
        return removed

    def remove_nft_tables(self) -> list[str]:
        """The nf_tables tables iptables-nft made for the chains above, once they hold no rule
        (an empty ``ip filter`` and the like, where there were none before)."""
        removed = []
        for table in nft_tables():
            if table in self.nft_tables:
                continue
            listing = json.loads(run("nft", "-j", "list", "table", *table.split()) or "{}")
            if any("rule" in item for item in listing.get("nftables", [])):
                continue
            run("nft", "delete", "table", *table.split(), check=False)
            removed.append(table)
        return removed

    def restore_sysctls(self) -> dict[str, str]:
        changed = {}
        for name, value in self.sysctls.items():
            if _sysctl(name) != value:
                with contextlib.suppress(OSError):
                    (Path("/proc/sys") / name).write_text(value)
                    changed[name] = value
        return changed


# -- the pod network's bridge and egress guard


def create_bridge(name: str, gateway_cidr: str) -> None:
    """The CNI bridge made beforehand with the gateway address, so the kubelet's node IP (the
    gateway) exists before the first pod; the bridge plugin adopts it."""
    if Path(f"/sys/class/net/{name}").exists():
        raise HostStateError(
            f"interface {name} exists: another one-node cluster is up (make node-down) "
            "or a previous one was not cleaned up (ip link delete " + name + ")"
        )
    run("ip", "link", "add", name, "type", "bridge")
    run("ip", "addr", "add", gateway_cidr, "dev", name)
    run("ip", "link", "set", name, "up")


def delete_bridge(name: str) -> bool:
    if not Path(f"/sys/class/net/{name}").exists():
        return False
    run("ip", "link", "delete", name, check=False)
    return True


def guard_egress(bridge: str, pod_cidr: str) -> None:
    """Pods may reach the pod network and the host, nothing that is forwarded elsewhere: the
    bridge plugin turns ip_forward on, so packets from the pod CIDR leaving by any other
    interface are dropped."""
    run("iptables", "-N", NODE_CHAIN)
    run("iptables", "-A", NODE_CHAIN, "-s", pod_cidr, "!", "-o", bridge, "-j", "DROP")
    run("iptables", "-I", "FORWARD", "1", "-j", NODE_CHAIN)


def mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def unmount_under(root: Path) -> list[str]:
    """Unmount everything mounted under ``root`` (the kubelet's volumes, containerd's rootfs
    and shm mounts), deepest first; lazily where a mount is busy."""
    points = sorted(set(mounts_under(root)), key=lambda p: -p.count("/"))
    for point in points:
        run("umount", point, check=False)
        if point in mounts_under(root):
            run("umount", "-l", point, check=False)
    return points


def cni_sandboxes(network: str) -> dict[str, str]:
    """Container ID -> network namespace name of each sandbox libcni cached a result of on
    ``network`` (in /var/lib/cni/results, which containerd 1.6's CRI uses whatever its root)."""
    found = {}
    if CNI_RESULTS.is_dir():
        for path in CNI_RESULTS.glob(f"{network}-*"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                cached = json.loads(path.read_text())
                cid = cached["containerId"]
                for iface in cached["result"].get("interfaces", []):
                    sandbox = iface.get("sandbox") or ""
                    if sandbox.startswith(("/run/netns/", "/var/run/netns/")):
                        found[cid] = Path(sandbox).name
    return found


def remove_cni_state(snapshot: HostSnapshot | None, network: str, ids: list[str]) -> list[str]:
    """libcni's cached results of our network and of the loopback of our sandbox ``ids``, and
    /var/lib/cni itself where it was not there before and is now empty."""
    removed = []
    if CNI_RESULTS.is_dir():
        ours = [*CNI_RESULTS.glob(f"{network}-*")]
        ours += [p for cid in ids for p in CNI_RESULTS.glob(f"cni-loopback-{cid}-*")]
        for path in ours:
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
    if snapshot is not None and not snapshot.cni_state:
        with contextlib.suppress(OSError):
            for d in sorted(CNI_RESULTS.parent.rglob("*"), key=lambda p: -len(p.parts)):
                d.rmdir()
            CNI_RESULTS.parent.rmdir()
    return removed


def sandbox_netns(socket_path: Path) -> list[str]:
    """Names (under /run/netns) of the network namespaces our containerd's containers use."""
    names = []
    ids = run("ctr", "-a", str(socket_path), "-n", "k8s.io", "containers", "ls", "-q", check=False)
    for cid in ids.split():
        with contextlib.suppress(HostStateError, ValueError, KeyError, TypeError):
            info = json.loads(
                run("ctr", "-a", str(socket_path), "-n", "k8s.io", "containers", "info", cid)
            )
            for ns in info["Spec"]["linux"]["namespaces"]:
                path = ns.get("path") or ""
                if ns["type"] == "network" and path.startswith(("/run/netns/", "/var/run/netns/")):
                    names.append(Path(path).name)
    return sorted(set(names))


def shim_pids(socket_path: Path) -> list[int]:
    """containerd-shim processes of the containerd that listens on ``socket_path``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and str(socket_path).encode() in argv:
            pids.append(int(proc.name))
    return pids


def _subtree(top: str) -> list[Path]:
    """`top` and every directory below it, as far as they still exist while walked: the kubelet
    and containerd remove cgroups at the same time, and a cgroup gone half-way through the walk
    must not end it (`Path.rglob` raises there; `os.walk` leaves it out)."""
    return [Path(d) for d, _dirs, _files in os.walk(top)]
