"""Hot handoff as Kubernetes runs it: the health and metrics listening sockets travel with the
state, so the new process answers on the very ports the old one bound (no bind conflict on a
host-network node, no probe refused meanwhile), and with `--handoff-idle` the old process stays
alive serving nothing until SIGTERM, then exits 0 at once. SIGUSR2 starts the successor from the
running process's own command line."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from support.echo import UdpEcho, udp_echo
from support.ports import free_port
from support.stunnerd_process import ManagedStunnerd, base_config, health_port, listener_ports
from support.turn_flows import STEP_TIMEOUT_S, Flow, open_flows, send_steadily

pytestmark = pytest.mark.integration

FLOWS = 10
SEND_INTERVAL_S = 0.05


@pytest.fixture
async def echo() -> AsyncIterator[UdpEcho]:
    """The echo peer, with room for the burst a paused relay sends at once."""
    async with udp_echo(receive_buffer_bytes=4 << 20) as peer:
        yield peer


def stunnerd(
    tmp: Path, name: str, ports: dict[str, int], admin: tuple[int, int], *args: str
) -> ManagedStunnerd:
    """A stunnerd on the shared listener, health and metrics ports."""
    home = tmp / name
    home.mkdir()
    config = base_config(admin[0], ports)
    config["admin"]["metrics_endpoint"] = f"http://127.0.0.1:{admin[1]}/metrics"
    # A watched origin brings the health server up before the first config: on this port too.
    return ManagedStunnerd(home, config, *args, health=admin[0])


async def get(port: int, path: str) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, body); ConnectionRefusedError when closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 2.0)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[-1]


async def probe(port: int, stop: asyncio.Event, failures: list[str]) -> int:
    """Poll /live until `stop`; every refused or failed probe goes to `failures`."""
    count = 0
    while not stop.is_set():
        try:
            code, _ = await get(port, "/live")
            if code != 200:
                failures.append(f"status {code}")
        except (OSError, TimeoutError) as exc:
            failures.append(repr(exc))
        count += 1
        await asyncio.sleep(0.01)
    return count


def serving_pid(path: Path) -> int:
    """The pid of the process listening at the handoff socket (SO_PEERCRED)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def serves_handoff(path: Path, pid: int) -> bool:
    """Whether process `pid` listens at the handoff socket now."""
    try:
        return serving_pid(path) == pid
    except OSError:
        return False


def listening_inodes(port: int) -> set[str]:
    """The inodes of the TCP sockets listening on `port` (IPv4 and IPv6)."""
    out: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                out.add(fields[9])
    return out


def holds(pid: int, inodes: set[str]) -> bool:
    """Whether process `pid` holds any of these sockets."""
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return False


def started_with(argument: str) -> set[int]:
    """The processes whose command line has `argument` (a path unique to one test)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if argument.encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                    found.add(int(proc.name))
    return found


async def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(
    ("workers", "watch"),
    [(0, False), (4, False), (0, True)],
    ids=["one-process", "4-workers", "watched-origin"],
)
async def test_the_successor_serves_health_and_metrics_on_the_same_sockets_and_the_old_idles(
    tmp_path: Path, echo: UdpEcho, workers: int, watch: bool
) -> None:
    """With a watched origin (as in a pod: the CDS) the first config comes after the start:
    the successor answers `serving` only once it applied."""
    ports = listener_ports("a")
    admin = (health_port(), free_port())
    handoff = tmp_path / "handoff" / "stunnerd.sock"
    args: tuple[str, ...] = ("--handoff-socket", str(handoff), "--udp-thread-num", str(workers))
    args += ("--handoff-idle", "-w") if watch else ("--handoff-idle",)
    old = stunnerd(tmp_path, "old", ports, admin, *args)
    new: ManagedStunnerd | None = None
    flows: list[Flow] = []
    try:
        await old.ready()
        assert (await get(admin[1], "/metrics"))[0] == 200
        flows = await open_flows(FLOWS, ports["a"])
        await asyncio.gather(*(flow.bind(echo.addr) for flow in flows))
        stop = asyncio.Event()
        failures: list[str] = []
        sender = asyncio.create_task(send_steadily(flows, echo.addr, stop, SEND_INTERVAL_S))
        prober = asyncio.create_task(probe(admin[0], stop, failures))
        try:
            await asyncio.sleep(0.3)
            started = time.monotonic()
            new = stunnerd(tmp_path, "new", ports, admin, *args)
            await wait_for(lambda: "idle until SIGTERM" in old.proc.output(), "the old to idle")
            handed = time.monotonic()
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await sender
            probes = await prober
        assert failures == [], f"{len(failures)} of {probes} probes failed: {failures[:5]}"
        assert probes > 20
        assert old.proc.alive(), "the old process idles instead of exiting"
        assert new.proc.alive()
        # The successor listens at the handoff socket once it has started up: on a busy machine
        # that can be more than a second after the old one idles.
        await wait_for(lambda: serves_handoff(handoff, new.proc.pid), "the new at the socket")
        # The very listening sockets the old process bound, now held by the new one only.
        admin_sockets = listening_inodes(admin[0]) | listening_inodes(admin[1])
        assert len(admin_sockets) == 2
        assert not holds(old.proc.pid, admin_sockets)
        assert holds(new.proc.pid, admin_sockets)
        lost = sum(len(flow.lost()) for flow in flows)
        gap = max(flow.receiver.longest_gap(started) for flow in flows)
        print(
            f"handoff-idle ({workers} workers): handed over {handed - started:.2f} s after the "
            f"new one started; lost {lost} datagrams; longest gap {gap:.2f} s; {probes} probes"
        )
        # The old process serves nothing: every answer on the shared ports is the new one's.
        status = await new.wait_status(
            lambda s: s["allocationCount"] == FLOWS, "every allocation in the new process"
        )
        assert status["status"] == "READY"
        for _ in range(10):
            assert (await get(admin[1], "/metrics"))[0] == 200
            code, body = await get(admin[0], "/status")
            assert code == 200
            assert f'"allocationCount": {FLOWS}'.encode() in body
        # SIGUSR2 would start a process that takes everything back: the idle one ignores it.
        os.kill(old.proc.pid, signal.SIGUSR2)
        await wait_for(lambda: "SIGUSR2 ignored" in old.proc.output(), "SIGUSR2 to be ignored")
        assert serving_pid(handoff) == new.proc.pid
        # SIGTERM ends the idle process at once with status 0; the clients go on.
        os.kill(old.proc.pid, signal.SIGTERM)
        code = await asyncio.to_thread(old.proc.proc.wait, 3.0)
        assert code == 0
        assert "received while idle: exiting" in old.log()
        assert await asyncio.gather(*(flow.refresh() for flow in flows)) == [0] * FLOWS
        assert (await get(admin[0], "/live"))[0] == 200
    finally:
        for flow in flows:
            flow.abandon()
        if new is not None:
            await new.close()
        await old.close()


async def test_sigusr2_starts_a_successor_from_the_same_command_line(
    tmp_path: Path, echo: UdpEcho
) -> None:
    ports = listener_ports("a")
    admin = (health_port(), free_port())
    handoff = tmp_path / "handoff" / "stunnerd.sock"
    old = stunnerd(tmp_path, "old", ports, admin, "--handoff-socket", str(handoff))
    successor = 0
    flows: list[Flow] = []
    try:
        await old.ready()
        flows = await open_flows(4, ports["a"])
        await asyncio.gather(*(flow.bind(echo.addr) for flow in flows))
        os.kill(old.proc.pid, signal.SIGUSR2)
        code = await asyncio.to_thread(old.proc.proc.wait, STEP_TIMEOUT_S)
        assert code == 0
        assert "SIGUSR2: starting a successor" in old.log()
        try:
            await wait_for(handoff.exists, "the successor to listen")
        except AssertionError as exc:
            # The successor writes to the same log as the process that started it.
            raise AssertionError(f"{exc}; the log:\n{old.log()[-4000:]}") from None
        successor = serving_pid(handoff)
        assert successor != old.proc.pid
        assert (await get(admin[0], "/status"))[0] == 200
        assert await asyncio.gather(*(flow.refresh() for flow in flows)) == [0] * len(flows)
        for flow in flows:
            flow.receiver.first.clear()
            flow.receiver.seen.pop(0, None)
        await asyncio.gather(*(flow.bind(echo.addr) for flow in flows))
    finally:
        for flow in flows:
            flow.abandon()
        # The successor is found by its socket, or else by its command line (the old process's,
        # with this test's own handoff path), so that a failed run leaves no process behind.
        for pid in {successor} | started_with(str(handoff)) - {0, old.proc.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                await asyncio.sleep(0.3)
                os.kill(pid, signal.SIGTERM)
        await old.close()
