"""The allocation storm of `bench turn`: K TURN allocations from C concurrent clients, each server
answering as fast as it can, and where our stunnerd's CPU per Allocate goes.

Each client runs its share of the K allocations one after another, every one from a fresh UDP
socket (a new 5-tuple), the way a browser allocates: an unauthenticated Allocate, the 401 with
realm and nonce, the Allocate again with long-term credentials (RFC 8489 §9.2, RFC 8656 §7.2).
The latency of an allocation is that whole exchange. The sockets stay open until the storm ends,
so every allocation is still held when the last one is made. The client is a few lines of
`struct` and `hmac` on one event loop (no STUN library), so the figures are the servers'.

The message builder, the answer parser, percentiles and the ratio lines are pure functions
(tests/unit/test_bench_alloc_storm.py); the profile split (`profile_split`) reads a `pstats`
file of stunnerd run under `cProfile`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import pstats
import struct
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MAGIC_COOKIE = 0x2112A442
ALLOCATE_REQUEST = 0x0003
ALLOCATE_SUCCESS = 0x0103
ALLOCATE_ERROR = 0x0113
ATTR_USERNAME = 0x0006
ATTR_MESSAGE_INTEGRITY = 0x0008
ATTR_ERROR_CODE = 0x0009
ATTR_REALM = 0x0014
ATTR_NONCE = 0x0015
ATTR_REQUESTED_TRANSPORT = 0x0019
UDP_TRANSPORT = struct.pack("!BBH", 17, 0, 0)

RETRANSMIT_S = 1.0
ATTEMPTS = 3


def _attr(kind: int, value: bytes) -> bytes:
    pad = (-len(value)) % 4
    return struct.pack("!HH", kind, len(value)) + value + b"\x00" * pad


def allocate_request(
    transaction: bytes,
    *,
    username: str = "",
    realm: str = "",
    nonce: bytes = b"",
    key: bytes = b"",
) -> bytes:
    """An Allocate request for UDP; with ``key``, signed with MESSAGE-INTEGRITY (RFC 8489 §14.5)."""
    body = _attr(ATTR_REQUESTED_TRANSPORT, UDP_TRANSPORT)
    if key:
        body += _attr(ATTR_USERNAME, username.encode())
        body += _attr(ATTR_REALM, realm.encode())
        body += _attr(ATTR_NONCE, nonce)
        # The length in the header covers MESSAGE-INTEGRITY itself (24 bytes) when it is computed.
        header = struct.pack("!HHI", ALLOCATE_REQUEST, len(body) + 24, MAGIC_COOKIE) + transaction
        digest = hmac.new(key, header + body, hashlib.sha1).digest()
        return header + body + _attr(ATTR_MESSAGE_INTEGRITY, digest)
    return struct.pack("!HHI", ALLOCATE_REQUEST, len(body), MAGIC_COOKIE) + transaction + body


def long_term_key(username: str, realm: str, password: str) -> bytes:
    return hashlib.md5(f"{username}:{realm}:{password}".encode()).digest()


@dataclass(frozen=True, slots=True)
class Answer:
    """What the storm reads of an answer: its type, error code, realm and nonce."""

    kind: int
    transaction: bytes
    code: int = 0
    realm: str = ""
    nonce: bytes = b""


def parse_answer(data: bytes) -> Answer | None:
    """The answer in ``data``, or None where it is no STUN message."""
    if len(data) < 20:
        return None
    kind, length, cookie = struct.unpack_from("!HHI", data)
    if cookie != MAGIC_COOKIE or len(data) < 20 + length:
        return None
    code, realm, nonce = 0, "", b""
    pos, end = 20, 20 + length
    while pos + 4 <= end:
        attr, size = struct.unpack_from("!HH", data, pos)
        value = data[pos + 4 : pos + 4 + size]
        if attr == ATTR_ERROR_CODE and size >= 4:
            code = (value[2] & 0x7) * 100 + value[3]
        elif attr == ATTR_REALM:
            realm = value.decode(errors="replace")
        elif attr == ATTR_NONCE:
            nonce = bytes(value)
        pos += 4 + size + (-size) % 4
    return Answer(kind, bytes(data[8:20]), code, realm, nonce)


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; NaN for none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-int(q * len(ordered) * 1000) // 1000))  # ceil without float noise
    return ordered[min(len(ordered), rank) - 1]


@dataclass
class StormResult:
    server: str
    wanted: int
    ok: int
    wall_s: float
    cpu_s: float
    latencies_s: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)

    @property
    def per_cpu_s(self) -> float:
        return self.ok / self.cpu_s if self.cpu_s > 0 else float("inf")

    @property
    def cpu_ms_per_allocation(self) -> float:
        return self.cpu_s * 1e3 / self.ok if self.ok else float("nan")


def ratio_lines(results: Mapping[str, StormResult], ours: str = "stunnerd") -> list[str]:
    """``RATIO storm cpu_per_allocation ours/<peer>`` for upstream and coturn, where measured."""
    lines: list[str] = []
    if ours not in results or not results[ours].ok:
        return lines
    mine = results[ours].cpu_ms_per_allocation
    for name, result in results.items():
        if name == ours or not result.ok or result.cpu_s <= 0:
            continue
        if name.startswith("upstream"):
            peer = "upstream"
        elif name == "coturn":
            peer = "coturn"
        else:
            continue
        lines.append(
            f"RATIO storm cpu_per_allocation ours/{peer} = "
            f"{mine / result.cpu_ms_per_allocation:.2f}  (ours: {ours}; {peer}: {name})"
        )
    return lines


NAME_WIDTH = 26


def report_lines(results: Mapping[str, StormResult]) -> list[str]:
    head = (
        f"{'server':<{NAME_WIDTH}} {'ok':>6} {'failed':>6} {'to last s':>9} {'CPU s':>7} "
        f"{'alloc/CPU-s':>11} {'ms CPU/alloc':>12} {'p50 ms':>7} {'p99 ms':>7}"
    )
    lines = [head]
    for name, r in results.items():
        lines.append(
            f"{name:<{NAME_WIDTH}} {r.ok:>6} {sum(r.failures.values()):>6} {r.wall_s:>9.2f} "
            f"{r.cpu_s:>7.2f} {r.per_cpu_s:>11.0f} {r.cpu_ms_per_allocation:>12.3f} "
            f"{percentile(r.latencies_s, 0.5) * 1e3:>7.1f} "
            f"{percentile(r.latencies_s, 0.99) * 1e3:>7.1f}"
        )
        if r.failures:
            lines.append(f"{'':<{NAME_WIDTH}} failures: {dict(sorted(r.failures.items()))}")
    return lines


# --- the client --------------------------------------------------------------------------------


class _Client(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.waiting: asyncio.Future[bytes] | None = None

    def datagram_received(self, data: bytes, addr: object) -> None:
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_exception(exc)


async def _exchange(
    transport: asyncio.DatagramTransport, proto: _Client, request: bytes
) -> Answer | None:
    loop = asyncio.get_running_loop()
    for _ in range(ATTEMPTS):
        proto.waiting = loop.create_future()
        transport.sendto(request)
        try:
            async with asyncio.timeout(RETRANSMIT_S):
                while True:
                    answer = parse_answer(await proto.waiting)
                    if answer is not None and answer.transaction == request[8:20]:
                        return answer
                    proto.waiting = loop.create_future()
        except TimeoutError:
            continue
    return None


async def _allocate(
    port: int, username: str, password: str, keys: dict[str, bytes], held: list[object]
) -> tuple[float, str]:
    """One allocation from a fresh socket: (seconds, "" or why it failed)."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    transport, proto = await loop.create_datagram_endpoint(
        _Client, local_addr=("127.0.0.1", 0), remote_addr=("127.0.0.1", port)
    )
    held.append(transport)
    first = await _exchange(transport, proto, allocate_request(os.urandom(12)))
    if first is None:
        return time.perf_counter() - started, "timeout (401)"
    if first.kind == ALLOCATE_SUCCESS:
        return time.perf_counter() - started, ""
    if first.code != 401 or not first.nonce:
        return time.perf_counter() - started, f"first answer {first.code or hex(first.kind)}"
    key = keys.get(first.realm)
    if key is None:
        key = keys[first.realm] = long_term_key(username, first.realm, password)
    request = allocate_request(
        os.urandom(12), username=username, realm=first.realm, nonce=first.nonce, key=key
    )
    second = await _exchange(transport, proto, request)
    if second is None:
        return time.perf_counter() - started, "timeout"
    if second.kind != ALLOCATE_SUCCESS:
        return time.perf_counter() - started, f"error {second.code}"
    return time.perf_counter() - started, ""


async def storm(
    port: int, allocations: int, clients: int, username: str, password: str, timeout_s: float
) -> tuple[list[float], Counter[str], float]:
    """(latencies of the successful allocations, failures by reason, seconds to the last one)."""
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    held: list[object] = []
    keys: dict[str, bytes] = {}
    share = [
        allocations // clients + (1 if i < allocations % clients else 0) for i in range(clients)
    ]
    started = time.perf_counter()
    last = started

    async def client(count: int) -> None:
        nonlocal last
        for _ in range(count):
            try:
                took, why = await _allocate(port, username, password, keys, held)
            except OSError as exc:
                failures[f"socket: {exc.strerror or exc}"] += 1
                continue
            if why:
                failures[why] += 1
            else:
                latencies.append(took)
                last = time.perf_counter()

    try:
        async with asyncio.timeout(timeout_s), asyncio.TaskGroup() as group:
            for i, count in enumerate(share):
                group.create_task(client(count), name=f"storm-client-{i}")
    except TimeoutError:
        failures["storm timed out"] += allocations - len(latencies) - sum(failures.values())
    finally:
        for transport in held:
            transport.close()  # type: ignore[attr-defined]
        await asyncio.sleep(0)
    return latencies, failures, last - started


def run_storm(
    port: int, allocations: int, clients: int, username: str, password: str, timeout_s: float
) -> tuple[list[float], Counter[str], float]:
    try:
        import uvloop

        factory: object = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:  # type: ignore[arg-type]
        return runner.run(storm(port, allocations, clients, username, password, timeout_s))


# --- where stunnerd's CPU goes --------------------------------------------------------------------

# (bucket, substrings of "file:function"); the first match wins, so the narrow ones come first.
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sendto (answers)", ("method 'sendto'",)),
    ("HMAC and key (auth)", ("hmac", "hashlib", "_hashlib", "turn/auth.py", "stunner_common/auth")),
    ("logging", ("logging/", "stunnerd/log", "json_log")),
    ("journal (workers)", ("handoff/transport/journal",)),
    ("quota", ("stunnerd/quota",)),
    (
        "relay socket set-up",
        (
            "net/allocate",
            "socket.py",
            "method 'bind'",
            "method 'setsockopt'",
            "create_datagram",
            "_socket.socket",
            "uvloop",
            "net/relay",
            "net/udp.py",
            "route_table",
        ),
    ),
    ("STUN codec", ("turn/codec", "stunner_common/stun", "aioice", "struct")),
    ("TURN engine", ("turn/",)),
    ("metrics", ("prometheus", "admin/metrics")),
    ("event loop (uvloop C I/O)", ("asyncio/", "selectors", "method 'poll'", "epoll")),
)


def bucket_of(where: str) -> str:
    for name, needles in BUCKETS:
        if any(n in where for n in needles):
            return name
    return "other"


def profile_split(path: str) -> tuple[dict[str, float], list[tuple[float, str]], float]:
    """(self time per bucket, the 15 functions with most self time, total) of a cProfile dump."""
    stats = pstats.Stats(path)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = stats.stats  # type: ignore[attr-defined]
    buckets: dict[str, float] = {}
    top: list[tuple[float, str]] = []
    total = 0.0
    for (filename, line, func), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        where = f"{filename}:{line}:{func}"
        bucket = bucket_of(where)
        buckets[bucket] = buckets.get(bucket, 0.0) + tottime
        top.append((tottime, where))
        total += tottime
    top.sort(reverse=True)
    return buckets, top[:15], total
