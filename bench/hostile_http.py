"""What one client can make the CDS and the auth service hold (`python -m bench hostile`, limits).

Neither has a coturn equivalent, so these run ours alone and print no ratio. One redis-server,
one `stunner-cds` fed by it (one config) and one `stunner-auth` reading that CDS, all on
127.0.0.1. Each attack comes from 127.0.0.2 at 10x a default of docs/limits.md
(`BENCH_HOSTILE_LIMITS_SCALE` scales the counts) beside 20 honest clients, each from an address
of its own in 127.0.1.0/24: for the CDS a watch each, which must see a config change published
after the attack; for the auth service a `GET /ice?service=turn` each, sent while the attacker
holds what it opened, which must answer 200. Per attack it prints the server's RSS and fd count
before and after (with the attacker's connections still open), the honest failures and the
attacker's answers by status code:
  - cds-watches: 10x `CDS_MAX_WATCHERS_PER_CLIENT` (256) watch upgrades, held;
  - cds-connections: 10x `CDS_MAX_HTTP_CONNECTIONS_PER_CLIENT` (64) idle connections, held;
  - cds-oversized, auth-oversized: 10 requests each of a head 10x `*_MAX_HEADER_BYTES`
    (16 KiB), a query 10x `*_MAX_QUERY_BYTES` (2 KiB) and a body announced at 10x
    `*_MAX_BODY_BYTES` (64 KiB), one connection each;
  - auth-connections: 10x `AUTH_MAX_CONNECTIONS_PER_CLIENT` (256) idle connections, held.
Idle connections are held for a few seconds, inside the 10 s request-head deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_cds import _free_port, _process, _RawWatcher, _redis_binary
from bench.bench_hostile import HEADER, Answers, Held, held_row, rss_and_fds

HONEST = 20
ATTACKER = "127.0.0.2"
CONFIG_ID = "bench/hostile"
WATCH_PATH = "/api/v1/configs?watch=true"
STEP_TIMEOUT_S = 10.0
ANSWER_WAIT_S = 1.0
CONNECT_BATCH = 100
# in-flight upgrades count as HTTP connections (64 per client) until they are upgraded
WATCH_BATCH = 32
# the defaults of docs/limits.md; each attack is 10x one of them
CDS_WATCHERS_PER_CLIENT = 256
CDS_HTTP_CONNECTIONS_PER_CLIENT = 64
AUTH_CONNECTIONS_PER_CLIENT = 256
MAX_HEADER_BYTES = 16 * 1024
MAX_QUERY_BYTES = 2 * 1024
MAX_BODY_BYTES = 64 * 1024

Release = Callable[[], None]


def honest_address(index: int) -> str:
    return f"127.0.1.{index + 1}"


def status_of(head: bytes) -> int | str:
    """The status code of an HTTP/1.1 response head, or what came instead."""
    if not head:
        return "closed"
    parts = head.split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return "unparsable"


def oversized_requests(scale: float) -> list[bytes]:
    """10 (scaled) requests of each kind: a head of 10x the head limit, a query of 7x the query
    limit (the most the head limit lets through) and a body announced at 10x the body limit."""
    count = max(1, int(10 * scale))
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * (10 * MAX_HEADER_BYTES)
    # 7x: a query of 10x would pass the head limit too and get 431
    query = b"GET /?service=turn&username=" + b"u" * (7 * MAX_QUERY_BYTES) + b" HTTP/1.1\r\n"
    body = b"POST / HTTP/1.1\r\nContent-Length: %d\r\n" % (10 * MAX_BODY_BYTES)
    ends = [head + b"\r\n\r\n", query + b"Host: x\r\n\r\n", body + b"Host: x\r\n\r\n"]
    return [request for request in ends for _ in range(count)]


def tally(statuses: list[int | str]) -> Answers:
    answers: Answers = {}
    for status in statuses:
        answers[status] = answers.get(status, 0) + 1
    return answers


async def _connect(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    async with asyncio.timeout(STEP_TIMEOUT_S):
        return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def _first_answer(reader: asyncio.StreamReader, wait_s: float) -> int | str:
    try:
        async with asyncio.timeout(wait_s):
            head = await reader.readuntil(b"\r\n")
    except TimeoutError:
        return "held (no answer)"
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        return status_of(getattr(exc, "partial", b""))
    return status_of(head)


async def oversized(port: int, scale: float) -> tuple[Answers, Release]:
    statuses: list[int | str] = []
    for request in oversized_requests(scale):
        try:
            reader, writer = await _connect(port, ATTACKER)
        except OSError:
            statuses.append("connect failed")
            continue
        with contextlib.suppress(ConnectionError):
            writer.write(request)
            await writer.drain()
        statuses.append(await _first_answer(reader, STEP_TIMEOUT_S))
        writer.close()
    return tally(statuses), lambda: None


async def idle_connections(port: int, count: int) -> tuple[Answers, Release]:
    """`count` connections that send nothing, opened in batches and held."""
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    failed = 0
    for start in range(0, count, CONNECT_BATCH):
        batch = range(start, min(count, start + CONNECT_BATCH))
        opened = await asyncio.gather(
            *(_connect(port, ATTACKER) for _ in batch), return_exceptions=True
        )
        for conn in opened:
            if isinstance(conn, BaseException):
                failed += 1
            else:
                conns.append(conn)
    statuses = await asyncio.gather(*(_first_answer(r, ANSWER_WAIT_S) for r, _ in conns))
    answers = tally(list(statuses))
    if failed:
        answers["connect failed"] = failed

    def release() -> None:
        for _, writer in conns:
            writer.close()

    return answers, release


async def open_watcher(port: int, source: str, on_frame: Callable[[bytes], None]) -> Any:
    """A raw WebSocket watch from `source` (answers pings); raises on a refused upgrade."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    host = f"127.0.0.1:{port}"
    transport, _ = await loop.create_connection(
        lambda: _RawWatcher(host, WATCH_PATH, on_frame, ready),
        "127.0.0.1",
        port,
        local_addr=(source, 0),
    )
    try:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            await ready
    except BaseException:
        transport.close()
        raise
    return transport


async def watches(port: int, count: int) -> tuple[Answers, Release]:
    transports: list[Any] = []
    statuses: list[int | str] = []
    for start in range(0, count, WATCH_BATCH):
        batch = range(start, min(count, start + WATCH_BATCH))
        opened = await asyncio.gather(
            *(open_watcher(port, ATTACKER, lambda _: None) for _ in batch),
            return_exceptions=True,
        )
        for result in opened:
            if isinstance(result, TimeoutError):
                statuses.append("timeout")
            elif isinstance(result, BaseException):
                statuses.append(status_of(str(result).encode()))
            else:
                transports.append(result)
                statuses.append(101)

    def release() -> None:
        for transport in transports:
            transport.close()

    return tally(statuses), release


@dataclass
class Services:
    redis_url: str
    cds_pid: int
    cds_port: int
    auth_pid: int
    auth_port: int
    published: int = 0


async def publish(services: Services) -> bytes:
    """Change the config's realm; the marker every watcher must then see."""
    import redis.asyncio as aioredis

    from stunner_common.config import parse_config
    from stunner_common.io.store import ConfigPublisher

    services.published += 1
    realm = f"hostile-{services.published:06d}"
    config = {
        "version": "v1",
        "admin": {"name": CONFIG_ID},
        "auth": {
            "type": "static",
            "realm": realm,
            "credentials": {"username": "u", "password": "p"},
        },
        "listeners": [
            {
                "name": f"{CONFIG_ID}/udp",
                "protocol": "TURN-UDP",
                "address": "127.0.0.1",
                "port": 3478,
                "public_address": "127.0.0.1",
                "public_port": 3478,
                "routes": ["bench/peers"],
            }
        ],
        "clusters": [{"name": "bench/peers", "endpoints": ["10.0.0.0/24"]}],
    }
    redis = aioredis.Redis.from_url(services.redis_url)
    try:
        await ConfigPublisher(redis).upsert(CONFIG_ID, parse_config(config))
    finally:
        await redis.aclose()
    return realm.encode()


class HonestWatchers:
    """HONEST watches, each from its own address, noting which saw a given marker."""

    def __init__(self) -> None:
        self.transports: list[Any] = []
        self.seen: list[bytes] = []

    async def open(self, port: int) -> int:
        failed = 0
        for i in range(HONEST):
            self.seen.append(b"")
            try:
                self.transports.append(
                    await open_watcher(port, honest_address(i), self._on_frame(i))
                )
            except (OSError, TimeoutError):
                failed += 1
        return failed

    def _on_frame(self, index: int) -> Callable[[bytes], None]:
        def note(payload: bytes) -> None:
            self.seen[index] += payload[-4096:]

        return note

    async def missed(self, marker: bytes) -> int:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(marker in seen for seen in self.seen):
                return 0
            await asyncio.sleep(0.05)
        return sum(marker not in seen for seen in self.seen)

    def close(self) -> None:
        for transport in self.transports:
            transport.close()


async def honest_ice(port: int) -> int:
    """HONEST `GET /ice?service=turn`, one per honest address; how many did not get 200."""

    async def one(i: int) -> int | str:
        try:
            reader, writer = await _connect(port, honest_address(i))
        except OSError:
            return "connect failed"
        writer.write(b"GET /ice?service=turn HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status = await _first_answer(reader, STEP_TIMEOUT_S)
        writer.close()
        return status

    statuses = await asyncio.gather(*(one(i) for i in range(HONEST)))
    return sum(status != 200 for status in statuses)


Attack = Callable[[Services], Awaitable[tuple[Answers, Release]]]


def attacks(scale: float) -> dict[str, tuple[str, Attack]]:
    """name: (the service attacked, the attack)."""
    return {
        "cds-watches": (
            "cds",
            lambda s: watches(s.cds_port, int(10 * CDS_WATCHERS_PER_CLIENT * scale)),
        ),
        "cds-connections": (
            "cds",
            lambda s: idle_connections(
                s.cds_port, int(10 * CDS_HTTP_CONNECTIONS_PER_CLIENT * scale)
            ),
        ),
        "cds-oversized": ("cds", lambda s: oversized(s.cds_port, scale)),
        "auth-connections": (
            "auth",
            lambda s: idle_connections(s.auth_port, int(10 * AUTH_CONNECTIONS_PER_CLIENT * scale)),
        ),
        "auth-oversized": ("auth", lambda s: oversized(s.auth_port, scale)),
    }


async def run_attack(services: Services, target: str, attack: Attack) -> Held:
    pid = services.cds_pid if target == "cds" else services.auth_pid
    held = Held()
    watchers = HonestWatchers()
    release: Release = lambda: None  # noqa: E731
    try:
        if target == "cds":
            held.honest_lost += await watchers.open(services.cds_port)
        held.rss_before, held.fds_before = rss_and_fds(pid)
        held.refusals, release = await attack(services)
        await asyncio.sleep(0.3)
        held.rss_after, held.fds_after = rss_and_fds(pid)
        held.honest_sent = HONEST
        if target == "cds":
            held.honest_lost += await watchers.missed(await publish(services))
        else:
            held.honest_lost += await honest_ice(services.auth_port)
    finally:
        release()
        watchers.close()
        await asyncio.sleep(0.3)
    return held


async def wait_ready(port: int) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            reader, writer = await _connect(port, "127.0.0.1")
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            status = await _first_answer(reader, STEP_TIMEOUT_S)
            writer.close()
            if status == 200:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError("the auth service never became ready")


async def measure(services: Services, scale: float) -> dict[str, dict[str, Held]]:
    await publish(services)
    await wait_ready(services.auth_port)
    names = os.environ.get("BENCH_HOSTILE_ATTACKS")
    results: dict[str, dict[str, Held]] = {}
    for name, (target, attack) in attacks(scale).items():
        if names and name not in names.split(","):
            continue
        results[name] = {target: await run_attack(services, target, attack)}
    return results


def report(results: dict[str, dict[str, Held]], scale: float) -> None:
    print(
        f"limits, CDS and auth service (no coturn equivalent: ours alone): each attack from "
        f"{ATTACKER} at 10x a default (scale {scale:g}) beside {HONEST} honest clients "
        f"(a watch each for the CDS, GET /ice for auth; 'honest loss' counts failures)"
    )
    print(HEADER)
    for name, by_server in results.items():
        for server, held in by_server.items():
            print(held_row(name, server, held))


def main(scale: float = 1.0) -> None:
    binary = _redis_binary()
    if binary is None:
        print("bench hostile limits (CDS, auth): no redis-server; skipped")
        return
    bindir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="bench-hostile-http-") as workdir:
        redis_port, cds_port, auth_port = _free_port(), _free_port(), _free_port()
        redis_argv = [binary, "--port", str(redis_port), "--bind", "127.0.0.1"]
        redis_argv += ["--dir", workdir, "--save", "", "--appendonly", "no"]
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        cds_argv = [str(bindir / "stunner-cds"), "--host", "127.0.0.1", "--port", str(cds_port)]
        cds_argv += ["--redis-url", redis_url, "--log-level", "WARNING"]
        auth_argv = [str(bindir / "stunner-auth"), "--host", "127.0.0.1", "--port", str(auth_port)]
        auth_argv += ["--cds-url", f"127.0.0.1:{cds_port}", "--log-level", "WARNING"]
        with (
            _process(redis_argv, redis_port),
            _process(cds_argv, cds_port) as cds,
            _process(auth_argv, auth_port) as auth,
        ):
            services = Services(redis_url, cds.pid, cds_port, auth.pid, auth_port)
            results = asyncio.run(measure(services, scale))
    report(results, scale)


if __name__ == "__main__":
    main(float(os.environ.get("BENCH_HOSTILE_LIMITS_SCALE", "1.0")))
