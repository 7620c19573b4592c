"""The one wrapper around a real stunnerd process, and TURN clients that echo through it.

`ManagedStunnerd` starts `python -m stunnerd` on a config file (or another origin), rewrites the
file atomically and waits on `/status` until the process has taken (or rejected) the new config.
`start_stunnerd` starts one with a listener of every kind (interop tests). `EchoAllocation` is
one aioice TURN allocation that sends to a UDP echo peer; `echoes()` tells whether data still
flows through that same allocation.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from aioice.turn import TurnTransport, create_turn_endpoint

from stunner_common.config import DEFAULT_HEALTHCHECK_ENDPOINT, self_signed_pair
from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess

REALM = "stunner.l7mp.io"
USER, PASSWORD, SECRET = "user1", "passwd1", "my-shared-secret"
PROTOCOLS = ("TURN-UDP", "TURN-TCP", "TURN-TLS", "TURN-DTLS")
STEP_TIMEOUT_S = 20.0


WATCH_ID = "stunner/udp-gateway"


def watch_config(realm: str, port: int = 3478) -> dict[str, Any]:
    """A one-listener config as the CDS serves it for WATCH_ID; `realm` tells versions apart.

    The password holds `$` on purpose: credentials must reach stunnerd unexpanded.
    """
    return {
        "version": "v1",
        "admin": {"name": WATCH_ID},
        "auth": {
            "type": "static",
            "realm": realm,
            "credentials": {"username": "user", "password": "pa$$word"},
        },
        "listeners": [
            {"name": "udp", "protocol": "TURN-UDP", "address": "$STUNNER_ADDR", "port": port}
        ],
        "clusters": [],
    }


def base_config(
    health_port: int, ports: dict[str, int], peer_cluster: str = "echo"
) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {
            "name": "default/gw",
            "loglevel": "all:INFO",
            "healthcheck_endpoint": f"http://127.0.0.1:{health_port}",
        },
        "auth": {"type": "static", "credentials": {"username": USER, "password": PASSWORD}},
        "listeners": [
            {
                "name": name,
                "protocol": "TURN-UDP",
                "address": "127.0.0.1",
                "port": port,
                "routes": [peer_cluster],
            }
            for name, port in ports.items()
        ],
        "clusters": [
            {"name": "echo", "type": "STATIC", "endpoints": ["127.0.0.1"]},
            {"name": "elsewhere", "type": "STATIC", "endpoints": ["10.255.255.1"]},
        ],
    }


class ManagedStunnerd:
    """stunnerd on a config file (default), or with `origin` (e.g. a CDS URL) and `health`.

    The health port comes from the config's `healthcheck_endpoint` or from `health` (passed as
    `STUNNERD_HEALTH_PORT`); where neither names one (a config without the field, an origin),
    a free port, never the default 8086. With an empty `healthcheck_endpoint`, `/status` is not
    reachable and only `wait_listeners` and `stop` apply.
    """

    def __init__(
        self,
        tmp: Path,
        config: dict[str, Any] | None,
        *args: str,
        origin: str | None = None,
        health: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.path = tmp / "stunnerd.json"
        self.config = copy.deepcopy(config or {})
        self.health_port: int | None = None
        full_env = {**os.environ, **(env or {})}
        if config is not None:
            self.path.write_text(json.dumps(self.config))
            endpoint = config["admin"].get("healthcheck_endpoint", DEFAULT_HEALTHCHECK_ENDPOINT)
            if endpoint:
                self.health_port = int(endpoint.rsplit(":", 1)[1])
        else:
            # Configs from an origin may name the default metrics port: a free one instead.
            full_env.setdefault("STUNNERD_METRICS_PORT", str(free_port()))
        if health is None and (config is None or "healthcheck_endpoint" not in config["admin"]):
            health = free_port()  # not stunnerd's default, 8086
        if health is not None:
            self.health_port = health
            full_env["STUNNERD_HEALTH_PORT"] = str(health)
        argv = [sys.executable, "-m", "stunnerd", "-c", origin or str(self.path)]
        self.proc = ServerProcess(
            [*argv, "--bind", "127.0.0.1", *args], env=full_env, log_path=tmp / "stunnerd.log"
        )
        self._http: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=2.0)
        return self._http

    async def status(self) -> dict[str, Any]:
        reply = await self.http.get(f"http://127.0.0.1:{self.health_port}/status")
        reply.raise_for_status()
        return dict(reply.json())

    async def get(self, path: str, port: int | None = None) -> httpx.Response:
        return await self.http.get(f"http://127.0.0.1:{port or self.health_port}{path}")

    async def wait_status(self, check: Any, what: str) -> dict[str, Any]:
        last: dict[str, Any] = {}
        deadline = asyncio.get_running_loop().time() + STEP_TIMEOUT_S
        while asyncio.get_running_loop().time() < deadline:
            if not self.proc.alive():
                raise AssertionError(f"stunnerd exited:\n{self.proc.output()[-3000:]}")
            try:
                last = await self.status()
                if check(last):
                    return last
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last status {last}\n{self.log()}")

    async def ready(self) -> dict[str, Any]:
        return await self.wait_status(lambda s: s.get("status") == "READY", "READY")

    async def write(self, config: dict[str, Any], *, expect: str = "applied") -> dict[str, Any]:
        """Replace the config file atomically and wait until stunnerd applied or rejected it."""
        before = (await self.status())["configs"][expect]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config))
        os.replace(tmp, self.path)
        status = await self.wait_status(
            lambda s: s["configs"][expect] > before, f"the config to be {expect}"
        )
        if expect == "applied":
            self.config = copy.deepcopy(config)
        return status

    def log(self) -> str:
        return self.proc.output()[-4000:]

    def wait_listeners(self, count: int, timeout_s: float = 15.0) -> None:
        """Block until `count` listeners printed their ready line."""
        wait_ready(self.proc, count, timeout_s)

    def stop(self) -> None:
        """Stop the process by PID (use `close()` where an event loop runs)."""
        self.proc.stop()

    async def close(self) -> None:
        """Stop without waiting for allocations: a second SIGTERM ends the drain at once."""
        if self._http is not None:
            await self._http.aclose()
        if self.proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            # Signals of one kind coalesce while pending: send the second once the first landed.
            for _ in range(100):
                if not self.proc.alive() or "received: draining" in self.proc.output():
                    break
                await asyncio.sleep(0.02)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.stop()


class TurnReceiver(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: asyncio.Queue[bytes] = asyncio.Queue()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.put_nowait(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class EchoAllocation:
    """One TURN allocation (aioice) whose data goes to `peer` and comes back."""

    def __init__(
        self, transport: TurnTransport, receiver: TurnReceiver, peer: tuple[str, int]
    ) -> None:
        self.transport = transport
        self.receiver = receiver
        self.peer = peer
        self.sent = 0

    @property
    def relay(self) -> tuple[str, int]:
        return tuple(self.transport.get_extra_info("sockname"))

    @classmethod
    async def open(
        cls, port: int, peer: tuple[str, int], user: str = USER, password: str = PASSWORD
    ) -> EchoAllocation:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            transport, receiver = await create_turn_endpoint(
                TurnReceiver, server_addr=("127.0.0.1", port), username=user, password=password
            )
        return cls(transport, receiver, peer)

    async def echoes(self, wait_s: float = 2.0, tries: int = 3) -> bool:
        """Send a numbered datagram and report whether it came back through this allocation."""
        for _ in range(tries):
            self.sent += 1
            payload = f"ping-{id(self)}-{self.sent}".encode()
            self.transport.sendto(payload, self.peer)
            try:
                async with asyncio.timeout(wait_s / tries):
                    while (await self.receiver.received.get()) != payload:
                        pass
                return True
            except TimeoutError:
                continue
        return False

    async def close(self) -> None:
        """Delete the allocation (Refresh with lifetime 0) and wait until it is gone."""
        self.transport.close()
        try:
            async with asyncio.timeout(5):
                await self.receiver.lost
        except TimeoutError:
            self.abandon()

    def abandon(self) -> None:
        """Drop the client socket without telling the server (its allocation is gone anyway)."""
        inner = self.transport._TurnTransport__inner_protocol  # type: ignore[attr-defined]
        if inner.transport is not None:
            inner.transport.close()


def listener_ports(*names: str) -> dict[str, int]:
    return {name: free_udp_tcp_port() for name in names}


def health_port() -> int:
    return free_port()


def wait_ready(proc: ServerProcess, count: int, timeout_s: float = 15.0) -> None:
    """Block until stunnerd printed `count` "listener ... ready on port" lines."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"stunnerd exited early:\n{proc.output()[-3000:]}")
        if len(re.findall(r"ready on port", proc.output())) >= count:
            return
        time.sleep(0.05)
    raise TimeoutError(f"stunnerd not ready:\n{proc.output()[-3000:]}")


@dataclass
class Stunnerd:
    """A stunnerd with one listener of every kind (`start_stunnerd`)."""

    proc: ManagedStunnerd
    ports: dict[str, int]  # protocol -> port
    cert_path: Path
    key_path: Path


def every_listener_config(
    auth: dict[str, object], cert: str, key: str
) -> tuple[dict[str, Any], dict[str, int]]:
    ports: dict[str, int] = {}
    listeners = []
    for proto in PROTOCOLS:
        port = free_udp_tcp_port()
        ports[proto] = port
        listener: dict[str, object] = {
            "name": f"default/gw/{proto.lower()}",
            "protocol": proto,
            "address": "127.0.0.1",
            "port": port,
            "routes": ["default/loopback"],
        }
        if proto in ("TURN-TLS", "TURN-DTLS"):
            listener.update(cert=cert, key=key)
        listeners.append(listener)
    config = {
        "version": "v1",
        "admin": {"name": "default/gw", "loglevel": "all:INFO", "healthcheck_endpoint": ""},
        "auth": auth,
        "listeners": listeners,
        "clusters": [{"name": "default/loopback", "type": "STATIC", "endpoints": ["127.0.0.0/8"]}],
    }
    return config, ports


def start_stunnerd(tmp: Path, auth: dict[str, object]) -> Stunnerd:
    """stunnerd with every listener kind on loopback; stop it with `.proc.stop()`."""
    cert_b64, key_b64 = self_signed_pair("127.0.0.1")
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(base64.b64decode(cert_b64))
    key_path.write_bytes(base64.b64decode(key_b64))
    config, ports = every_listener_config(auth, cert_b64, key_b64)
    # tests stop it with allocations still open
    server = ManagedStunnerd(tmp, config, "--grace-period", "0")
    try:
        server.wait_listeners(len(PROTOCOLS))
    except BaseException:
        server.stop()
        raise
    return Stunnerd(server, ports, cert_path, key_path)
