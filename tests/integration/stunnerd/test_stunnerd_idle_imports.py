"""An idle stunnerd imports only what its config uses (docs/scale.md, the footprint section).

A stunnerd with one plain TURN/UDP listener from a JSON file (no TLS or DTLS, no quota, no
offload, no metrics, no CDS or Kubernetes origin) must not have loaded the packages that only
those features need: each costs megabytes of resident memory in every process, the supervisor
and each worker alike. A `sitecustomize` on the child's PYTHONPATH dumps `sys.modules` of every
Python process of the tree (the supervisor and, with `--udp-thread-num`, each worker) on a
real-time signal, once the listener serves; nothing about memory is timed or measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from stunner_common.io.store import ConfigPublisher
from support.cds_server import CdsServer
from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess
from support.stunnerd_process import PASSWORD, USER, WATCH_ID, wait_ready, watch_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

STUNNERD = str(Path(sys.executable).with_name("stunnerd"))
DUMP_SIGNAL = signal.SIGRTMIN + 3
OUT_ENV = "IDLE_IMPORTS_OUT"

SITECUSTOMIZE = f"""
import json, os, signal, sys

def _dump(*_):
    path = os.path.join(os.environ[{OUT_ENV!r}], f"{{os.getpid()}}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(sorted(sys.modules), out)
    os.replace(path + ".tmp", path)

if os.environ.get({OUT_ENV!r}):
    signal.signal({int(DUMP_SIGNAL)}, _dump)
"""

# What each package is for: a process whose config does not use it must not import it.
LAZY = {
    "cryptography": "TLS/DTLS certificates",
    "OpenSSL": "TURN-DTLS listeners",
    "redis": "the cluster-wide quota (STUNNERD_QUOTA_REDIS_URL)",
    "prometheus_client": "a metrics endpoint",
    "dns": "aioice's ICE stack (the codec needs aioice.stun alone)",
    "ifaddr": "aioice's ICE stack",
    "yaml": "a YAML (not JSON) config",
    "httpx": "a Kubernetes origin, or a one-shot CDS load",
    "websockets": "a Kubernetes origin (the CDS watch has its own client)",
    "jsonpatch": "a CDS origin, once a v2 patch arrives",
    "pydantic_settings": "the other services' settings (stunnerd reads its own into dataclasses)",
    "pydantic": "the other services' wire and settings models (the config models are plain)",
    "pydantic_core": "pydantic",
    "importlib.metadata": "`--version` (the installed distribution's version)",
    "annotated_types": "nothing: stunnerd's settings carry their bounds in stunnerd.bounds",
    "tempfile": "loading a TLS/DTLS certificate (and argparse's help width: shutil)",
    "shutil": "argparse's help, when it is asked to find the terminal's width itself",
    "uuid": "an identity for a host without a name",
    "unicodedata": "resolving a host name (IP literals are bound as they are)",
    "ctypes": "the kernel offload (libbpf), once an engine is configured",
    "datetime": "making a self-signed certificate",
}

# What none of a stunnerd's origins needs: a general-purpose HTTP or WebSocket client's baggage.
NEVER = {
    "http.client": "an HTTP client (the CDS watch speaks HTTP/1.1 for its upgrade only)",
    "urllib.request": "proxy discovery",
    "email": "HTTP header parsing by the standard library",
}

# What only worker processes (`--udp-thread-num` above 1) or a hot handoff use.
MULTI_PROCESS = {
    "stunnerd.workers.worker": "starting worker processes",
    "stunnerd.workers.pool": "the supervisor of worker processes",
    "stunner_common.contracts.worker_messages": "the supervisor's channel to its workers",
    "stunnerd.handoff.transport.channel": "a hot handoff",
    "stunnerd.handoff.transport.journal": "the workers' allocation journal",
}


def plain_udp_config(port: int, health_port: int) -> dict[str, object]:
    return {
        "version": "v1",
        "admin": {
            "name": "default/idle",
            "loglevel": "all:INFO",
            "healthcheck_endpoint": f"http://127.0.0.1:{health_port}",
            "metrics_endpoint": "",
        },
        "auth": {"type": "static", "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [
            {"name": "udp", "protocol": "TURN-UDP", "address": "127.0.0.1", "port": port}
        ],
        "clusters": [],
    }


def probe_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a stunnerd whose processes dump their modules on DUMP_SIGNAL."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = tmp_path / "modules"
    out.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("STUNNERD_", "STUNNER_", "CDS_"))
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env[OUT_ENV] = str(out)
    return env, out


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def dump_modules(pids: list[int], out: Path, timeout_s: float = 20.0) -> dict[int, set[str]]:
    for pid in pids:
        os.kill(pid, DUMP_SIGNAL)
    deadline = time.monotonic() + timeout_s
    paths = {pid: out / f"{pid}.json" for pid in pids}
    while not all(path.exists() for path in paths.values()):
        assert time.monotonic() < deadline, f"no module list from {sorted(paths)}"
        time.sleep(0.05)
    return {pid: set(json.loads(path.read_text())) for pid, path in paths.items()}


def loaded(modules: set[str], packages: dict[str, str]) -> dict[str, str]:
    tops = {name.split(".")[0] for name in modules}
    return {
        package: why for package, why in packages.items() if package in tops or package in modules
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_an_idle_plain_udp_stunnerd_imports_no_package_of_a_feature_it_does_not_use(
    tmp_path: Path, workers: int
) -> None:
    env, out = probe_env(tmp_path)
    config = tmp_path / "stunnerd.json"
    config.write_text(json.dumps(plain_udp_config(free_udp_tcp_port(), free_port())))
    argv = [STUNNERD, "-c", str(config), "--bind", "127.0.0.1", "--grace-period", "0"]
    if workers:
        argv += ["--udp-thread-num", str(workers)]
    proc = ServerProcess(argv, env=env, log_path=tmp_path / "stunnerd.log")
    try:
        wait_ready(proc, 1)
        time.sleep(0.5)  # idle: past the first apply
        worker_pids = children(proc.pid)
        assert len(worker_pids) == workers, proc.output()[-3000:]
        modules = dump_modules([proc.pid, *worker_pids], out)
    finally:
        proc.stop()
    supervisor = modules.pop(proc.pid)
    assert "stunnerd.app" in supervisor  # the dump is of stunnerd itself
    assert loaded(supervisor, LAZY | NEVER) == {}
    if not workers:
        assert loaded(supervisor, MULTI_PROCESS) == {}
    for pid, worker in modules.items():
        assert "stunnerd.workers.child" in worker
        assert loaded(worker, LAZY | NEVER) == {}, f"worker {pid}"


async def test_a_stunnerd_following_the_cds_imports_no_general_purpose_client(
    tmp_path: Path, cds: CdsServer, publisher: ConfigPublisher
) -> None:
    """As in a pod: the config comes from the real CDS over a v2 watch (docs/scale.md, the
    footprint with a CDS origin)."""
    env, out = probe_env(tmp_path)
    env["STUNNERD_BOOTSTRAP_HEALTH_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    env["STUNNER_ADDR"] = "127.0.0.1"
    await publisher.upsert(WATCH_ID, watch_config("idle", free_udp_tcp_port()))
    argv = [STUNNERD, "-w", "-c", cds.url, "--id", WATCH_ID, "--bind", "127.0.0.1"]
    proc = ServerProcess(argv, env=env, log_path=tmp_path / "stunnerd.log")
    try:
        wait_ready(proc, 1)
        await asyncio.sleep(0.5)
        modules = dump_modules([proc.pid], out)[proc.pid]
    finally:
        proc.stop()
    assert "stunner_common.io.cds.websocket" in modules  # it did follow the CDS
    assert loaded(modules, LAZY | NEVER) == {}
