"""What an attacker without credentials costs: stunnerd against coturn, the same bytes at both.

Each scenario is one kind of datagram a client without credentials can send: a bare Allocate
(answered 401), a Binding request (answered by design), an Allocate carrying bogus credentials,
an MTU-sized Allocate stuffed with XOR-PEER-ADDRESS attributes, a 2 KB and a 60 KB one, and
random bytes. Every datagram is sent to both servers in alternating rounds, in paced bursts from
one source, and the report gives, per scenario:
  - server CPU per datagram (on-CPU time of every thread of the server's process tree, from
    /proc/*/task/*/schedstat, before and after), as `RATIO cpu_per_hostile[...]
    stunnerd/coturn` (the goal is at most 2);
  - bytes answered per byte received (the amplification factor) for each server, and
    `RATIO amplification[...] stunnerd/coturn` where coturn answers at all (the goal is at most 1).
The servers are set up as in `bench_turn` (coturn 4.6 with long-term credentials and one relay
thread, stunnerd with one static user). Everything binds 127.0.0.1; every loop is bounded.
`BENCH_HOSTILE_CHALLENGE_RATE_PER_S=0` runs stunnerd with its per-source 401 budget off (coturn
has none), so every challenge is answered; the load average is printed before and after.

The second part (`limits`) is what an attacker can make a server *hold*: for each resource an
attacker at 10x stunnerd's default limit (docs/limits.md) beside 20 honest clients (each an
allocation sending Send indications to a UDP echo peer). It prints, per server, the server's RSS
and fd count before and after (with what the attacker opened still held), the honest clients'
loss and the attacker's answers by code, and `RATIO limits_rss_growth[...] stunnerd/coturn`:
  - auth-guess: wrong-password Allocates, 10x the per-source failure burst (the 401 oracle);
  - permissions, channels: one allocation asks for 10x the per-allocation cap;
  - user-quota: both servers with the same allocation quota per user (the config's
    `admin.user_quota`, coturn's `--user-quota`; `BENCH_HOSTILE_USER_QUOTA`, default 10) and
    TURN REST credentials (one shared secret); the attacker opens 10x the quota with one username,
    each from a source port of its own, the honest clients have usernames of their own;
  - tcp-per-source: 10x the per-source cap (64) of idle TCP connections to the TURN port (stunnerd
    gets a TURN-TCP listener beside its UDP one, coturn listens on both anyway), held while the
    honest clients run: how many connected and how many the server kept;
  - tcp-slowloris: 64 connections (from 127.0.0.3) that send 10 bytes of a STUN header and stall:
    how long until the server closes them, and how many are open after
    `BENCH_HOSTILE_SLOW_WAIT_S` (15; stunnerd's `STUNNERD_FIRST_MESSAGE_TIMEOUT_S` is left at
    its 10 s default).
coturn has a knob for none of these but the quota (`--total-quota` bounds allocations in all),
so it runs with its defaults for the others. RFC 6062 peer connections per allocation are left
out: coturn needs a TCP relay set up for them, and a Connect flood a TCP peer per connection.
Then the CDS and the auth service, which have no coturn equivalent (`bench.hostile_http`).
`BENCH_HOSTILE_PART=cpu|limits` runs one part; `BENCH_HOSTILE_LIMITS_SCALE` (default 1.0)
scales the attack counts; `BENCH_HOSTILE_ATTACKS=name,...` picks attacks by name.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aioice import stun as aioice_stun

from bench.bench_turn import (
    PASSWORD,
    REALM,
    USER,
    coturn_args,
    free_port,
    process,
    stunnerd_config,
    tree_pids,
    wait_udp_listening,
)

MAGIC = 0x2112A442
ALLOCATE, BINDING = 0x0003, 0x0001
ROUNDS = int(os.environ.get("BENCH_HOSTILE_ROUNDS", "3"))
CHALLENGE_RATE = os.environ.get("BENCH_HOSTILE_CHALLENGE_RATE_PER_S")
BYTES_PER_RUN = int(os.environ.get("BENCH_HOSTILE_BYTES", str(6_000_000)))
MAX_DATAGRAMS = 20_000
BURST = 32
BURST_GAP_S = 0.002
RUN_TIMEOUT_S = 60.0
SETTLE_S = 0.3


def cpu_seconds(pid: int) -> float:
    """On-CPU time of every thread of pid and its descendants, from schedstat (ns resolution).

    /proc/PID/stat counts in clock ticks (10 ms), too coarse for a few microseconds a datagram.
    """
    total = 0
    for p in tree_pids(pid):
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def attribute(kind: int, value: bytes) -> bytes:
    padding = b"\x00" * (-len(value) % 4)
    return struct.pack("!HH", kind, len(value)) + value + padding


def stun(method: int, attributes: bytes = b"") -> bytes:
    return struct.pack("!HHI", method, len(attributes), MAGIC) + os.urandom(12) + attributes


def xor_peer_address(index: int) -> bytes:
    port = (40000 + index) ^ (MAGIC >> 16)
    address = (0x7F000001 + index) ^ MAGIC
    return attribute(0x0012, struct.pack("!BBHI", 0, 1, port, address))


def stuffed(size: int) -> Callable[[], bytes]:
    count = (size - 20) // 12

    def build() -> bytes:
        return stun(ALLOCATE, b"".join(xor_peer_address(i) for i in range(count)))

    return build


def bogus_credentials() -> bytes:
    attrs = (
        attribute(0x0019, b"\x11\x00\x00\x00")  # REQUESTED-TRANSPORT: UDP
        + attribute(0x0006, USER.encode())
        + attribute(0x0014, REALM.encode())
        + attribute(0x0015, b"x" * 32)  # a NONCE neither server issued
    )
    header_length = len(attrs) + 24
    body = struct.pack("!HHI", ALLOCATE, header_length, MAGIC) + os.urandom(12) + attrs
    return body + attribute(0x0008, os.urandom(20))


def random_bytes() -> bytes:
    return os.urandom(1400)


SCENARIOS: dict[str, Callable[[], bytes]] = {
    "allocate-20B": lambda: stun(ALLOCATE),
    "binding-20B": lambda: stun(BINDING),
    "bad-credentials": bogus_credentials,
    "attrs-1480B": stuffed(1480),
    "attrs-2KB": stuffed(2084),
    "attrs-60KB": stuffed(60_000),
    "random-1400B": random_bytes,
}


@dataclass
class Tally:
    sent: int = 0
    sent_bytes: int = 0
    answers: int = 0
    answer_bytes: int = 0
    largest_answer: int = 0
    cpu_s: list[float] = field(default_factory=list)
    per_datagram_us: list[float] = field(default_factory=list)

    @property
    def amplification(self) -> float:
        return self.answer_bytes / self.sent_bytes if self.sent_bytes else 0.0


def blast(pid: int, port: int, build: Callable[[], bytes], tally: Tally) -> None:
    """Send one run of a scenario in paced bursts and collect every answer."""
    sample = build()
    count = max(50, min(MAX_DATAGRAMS, BYTES_PER_RUN // len(sample)))
    datagrams = [build() for _ in range(count)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        target = ("127.0.0.1", port)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        before = cpu_seconds(pid)
        for start in range(0, count, BURST):
            for datagram in datagrams[start : start + BURST]:
                s.sendto(datagram, target)
                tally.sent += 1
                tally.sent_bytes += len(datagram)
            _collect(s, tally, BURST_GAP_S)
            if time.monotonic() > deadline:
                break
        _collect(s, tally, SETTLE_S)
        cpu = cpu_seconds(pid) - before
    tally.cpu_s.append(cpu)
    tally.per_datagram_us.append(cpu * 1e6 / count)


def _collect(s: socket.socket, tally: Tally, wait_s: float) -> None:
    end = time.monotonic() + wait_s
    while True:
        try:
            data = s.recv(65536)
        except BlockingIOError:
            if time.monotonic() >= end:
                return
            time.sleep(0.0005)
            continue
        tally.answers += 1
        tally.answer_bytes += len(data)
        tally.largest_answer = max(tally.largest_answer, len(data))


def cpu_main() -> None:
    turnserver = shutil.which("turnserver") or "/usr/bin/turnserver"
    if not os.access(turnserver, os.X_OK):
        print("bench hostile: turnserver (coturn) is not installed; skipped")
        return
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp_name:
        tmp = Path(tmp_name)
        coturn_port, stunnerd_port = free_port(), free_port()
        cfg = tmp / "stunnerd.json"
        cfg.write_text(json.dumps(stunnerd_config(stunnerd_port)))
        coturn_argv = coturn_args(turnserver, coturn_port, tmp, min_port=51000)
        results: dict[str, dict[str, Tally]] = {
            name: {"coturn": Tally(), "stunnerd": Tally()} for name in SCENARIOS
        }
        sd_env = dict(os.environ)
        if CHALLENGE_RATE is not None:
            sd_env["STUNNERD_CHALLENGE_RATE_PER_S"] = CHALLENGE_RATE
        load_before = os.getloadavg()
        with (
            process(coturn_argv, tmp / "coturn.log") as coturn,
            process(
                [stunnerd, "-c", str(cfg), "--bind", "127.0.0.1"], tmp / "sd.log", env=sd_env
            ) as sd,
        ):
            wait_udp_listening(coturn_port, coturn, tmp / "coturn.log")
            wait_udp_listening(stunnerd_port, sd, tmp / "sd.log")
            servers = {"coturn": (coturn.pid, coturn_port), "stunnerd": (sd.pid, stunnerd_port)}
            for _ in range(ROUNDS):
                for name, build in SCENARIOS.items():
                    for server, (pid, port) in servers.items():
                        blast(pid, port, build, results[name][server])
            for server, proc in (("coturn", coturn), ("stunnerd", sd)):
                if proc.poll() is not None:
                    raise RuntimeError(f"{server} died under hostile input")
    report(results, load_before, os.getloadavg())


def report(
    results: dict[str, dict[str, Tally]],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> None:
    budget = "off" if CHALLENGE_RATE in ("0", "0.0") else "on"
    print(
        f"{ROUNDS} alternating rounds; per run about {BYTES_PER_RUN // 1_000_000} MB "
        f"(at most {MAX_DATAGRAMS} datagrams) in bursts of {BURST}, one source; "
        f"stunnerd's 401 budget {budget}"
    )
    print(
        "load average (1/5/15 min) before "
        + "/".join(f"{x:.1f}" for x in load_before)
        + ", after "
        + "/".join(f"{x:.1f}" for x in load_after)
    )
    print(
        f"{'scenario':<16} {'server':<9} {'datagrams':>9} {'answers':>8} {'largest':>7} "
        f"{'ampl.':>6} {'µs CPU/datagram (runs)':>28}"
    )
    for name, by_server in results.items():
        for server, t in by_server.items():
            runs = " ".join(f"{us:.1f}" for us in t.per_datagram_us)
            print(
                f"{name:<16} {server:<9} {t.sent:>9} {t.answers:>8} {t.largest_answer:>7} "
                f"{t.amplification:>6.2f} {runs:>28}"
            )
    for name, by_server in results.items():
        coturn, sd = by_server["coturn"], by_server["stunnerd"]
        c_us = statistics.median(coturn.per_datagram_us)
        s_us = statistics.median(sd.per_datagram_us)
        ratios = [
            s / c for s, c in zip(sd.per_datagram_us, coturn.per_datagram_us, strict=True) if c > 0
        ]
        spread = f" (runs {min(ratios):.2f}-{max(ratios):.2f})" if ratios else ""
        if c_us > 0:
            print(f"RATIO cpu_per_hostile[{name}] stunnerd/coturn = {s_us / c_us:.2f}{spread}")
        else:
            print(f"cpu_per_hostile[{name}]: coturn used no measurable CPU; stunnerd {s_us:.1f} µs")
    for name, by_server in results.items():
        coturn, sd = by_server["coturn"], by_server["stunnerd"]
        if coturn.amplification > 0:
            ratio = sd.amplification / coturn.amplification
            print(
                f"RATIO amplification[{name}] stunnerd/coturn = {ratio:.2f} "
                f"(stunnerd {sd.amplification:.2f}, coturn {coturn.amplification:.2f} bytes/byte)"
            )
        else:
            print(
                f"amplification[{name}]: coturn silent; stunnerd {sd.amplification:.2f} "
                f"bytes/byte ({sd.answers} answers)"
            )


# --------------------------------------------------------------------------- what a server holds

PART = os.environ.get("BENCH_HOSTILE_PART", "all")
LIMITS_SCALE = float(os.environ.get("BENCH_HOSTILE_LIMITS_SCALE", "1.0"))
HONEST = 20
HONEST_DATAGRAMS = 20
ANSWER_TIMEOUT_S = 2.0
ATTACK_TIMEOUT_S = 60.0
# stunnerd's defaults (docs/limits.md); the attack is 10x each
AUTH_FAILURE_BURST = 30
MAX_PERMISSIONS = 256
MAX_CHANNELS = 256
REQUESTED_UDP = 17 << 24


def rss_and_fds(pid: int) -> tuple[int, int]:
    """Resident bytes and open fds of pid and its descendants."""
    rss = fds = 0
    for p in tree_pids(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
    return rss, fds


class SyncTurn:
    """A blocking long-term-credential TURN client on one UDP socket (127.0.0.1 only)."""

    def __init__(
        self,
        port: int,
        source: str = "127.0.0.1",
        password: str = PASSWORD,
        username: str = USER,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((source, 0))
        self.sock.settimeout(ANSWER_TIMEOUT_S)
        self.server = ("127.0.0.1", port)
        self.password = password
        self.username = username
        self.nonce: bytes | None = None
        self.realm = REALM

    def close(self) -> None:
        self.sock.close()

    def request(self, method: int, attrs: dict[str, object]) -> tuple[int, str]:
        """(0, "") on success, else the error code and reason; (-1, "timeout") unanswered."""
        stun_ = aioice_stun
        for _ in range(2):
            msg = stun_.Message(stun_.Method(method), stun_.Class.REQUEST, attributes=dict(attrs))
            if self.nonce is not None:
                attrs_ = {"USERNAME": self.username, "REALM": self.realm, "NONCE": self.nonce}
                msg.attributes.update(attrs_)
                key = f"{self.username}:{self.realm}:{self.password}".encode()
                msg.add_message_integrity(hashlib.md5(key).digest())
            self.sock.sendto(bytes(msg), self.server)
            reply = self._answer(msg.transaction_id)
            if reply is None:
                return -1, "timeout"
            code, reason = reply.attributes.get("ERROR-CODE", (0, ""))
            if (code == 401 and self.nonce is None) or code == 438:
                self.nonce, self.realm = reply.attributes["NONCE"], reply.attributes["REALM"]
                continue
            return int(code), str(reason)
        return int(code), str(reason)

    def _answer(self, transaction_id: bytes) -> Any:
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            try:
                reply = aioice_stun.parse_message(data)
            except ValueError:
                continue
            if reply.transaction_id == transaction_id:
                return reply
        return None

    def allocate(self) -> tuple[int, str]:
        return self.request(0x003, {"REQUESTED-TRANSPORT": REQUESTED_UDP})

    def echo_loss(self, peer: tuple[str, int], count: int) -> int:
        """Send `count` Send indications to the echo peer; how many never came back."""
        stun_ = aioice_stun
        for i in range(count):
            msg = stun_.Message(
                stun_.Method.SEND,
                stun_.Class.INDICATION,
                attributes={"XOR-PEER-ADDRESS": peer, "DATA": f"ping {i}".encode()},
            )
            self.sock.sendto(bytes(msg), self.server)
        got = 0
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while got < count and time.monotonic() < deadline:
            try:
                self.sock.recv(65536)
            except TimeoutError:
                break
            got += 1
        return count - got


def echo_server() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)

    def serve() -> None:
        while sock.fileno() >= 0:
            try:
                data, addr = sock.recvfrom(65536)
                sock.sendto(data, addr)
            except TimeoutError:
                continue
            except OSError:
                return

    threading.Thread(target=serve, name="bench-echo", daemon=True).start()
    return sock, int(sock.getsockname()[1])


Answers = dict[int | str, float]
Finish = Callable[[], Answers]


def _no_finish() -> Answers:
    return {}


def _count(answers: Answers, key: int | str) -> None:
    answers[key] = answers.get(key, 0) + 1


def guesses(port: int) -> tuple[Answers, Finish]:
    """10x the failure burst of wrong-password Allocates from 127.0.0.2."""
    attacker = SyncTurn(port, "127.0.0.2", password="guess")
    refusals: Answers = {}
    try:
        deadline = time.monotonic() + ATTACK_TIMEOUT_S
        for _ in range(int(10 * AUTH_FAILURE_BURST * LIMITS_SCALE)):
            code, reason = attacker.allocate()
            _count(refusals, "401 (not checked)" if "too many" in reason else code)
            if time.monotonic() > deadline:
                break
    finally:
        attacker.close()
    return refusals, _no_finish


def hoard(port: int, kind: str) -> tuple[Answers, Finish]:
    """One allocation from 127.0.0.2 asks for 10x the permissions (or channels) cap."""
    attacker = SyncTurn(port, "127.0.0.2")
    refusals: Answers = {}
    try:
        attacker.allocate()
        cap = MAX_PERMISSIONS if kind == "permissions" else MAX_CHANNELS
        deadline = time.monotonic() + ATTACK_TIMEOUT_S
        for i in range(int(10 * cap * LIMITS_SCALE)):
            if kind == "permissions":
                peer = (f"127.9.{i // 250}.{i % 250 + 1}", 9)
                code, _ = attacker.request(0x008, {"XOR-PEER-ADDRESS": peer})
            else:
                number = 0x4000 + i % 0x1000
                attrs = {"XOR-PEER-ADDRESS": ("127.9.0.1", 10000 + i), "CHANNEL-NUMBER": number}
                code, _ = attacker.request(0x009, attrs)
            _count(refusals, code)
            if time.monotonic() > deadline:
                break
    finally:
        attacker.close()
    return refusals, _no_finish


# --- allocations per user: both servers run with the same quota and TURN REST credentials

USER_QUOTA = int(os.environ.get("BENCH_HOSTILE_USER_QUOTA", "10"))
SECRET = "bench-hostile-secret"


def rest_credentials(user_id: str, now: float | None = None) -> tuple[str, str]:
    """A TURN REST username (``expiry:user``) valid for an hour and its password."""
    expiry = int((time.time() if now is None else now) + 3600)
    username = f"{expiry}:{user_id}"
    digest = hmac.new(SECRET.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode("ascii")


def quota_config(port: int) -> dict[str, object]:
    cfg = stunnerd_config(port)
    cfg["auth"] = {"type": "ephemeral", "realm": REALM, "credentials": {"secret": SECRET}}
    admin = cfg["admin"]
    assert isinstance(admin, dict)
    admin["user_quota"] = USER_QUOTA
    return cfg


def quota_args() -> list[str]:
    return ["--use-auth-secret", f"--static-auth-secret={SECRET}", f"--user-quota={USER_QUOTA}"]


def honest_user(index: int) -> tuple[str, str]:
    return rest_credentials(f"honest-{index}")


def over_quota(port: int) -> tuple[Answers, Finish]:
    """10x the quota of allocations, one username, each from a port of its own on 127.0.0.2."""
    username, password = rest_credentials("attacker")
    refusals: Answers = {}
    held: list[SyncTurn] = []
    deadline = time.monotonic() + ATTACK_TIMEOUT_S
    for _ in range(int(10 * USER_QUOTA * LIMITS_SCALE)):
        client = SyncTurn(port, "127.0.0.2", password=password, username=username)
        code, _ = client.allocate()
        _count(refusals, code)
        if code == 0:
            held.append(client)
        else:
            client.close()
        if time.monotonic() > deadline:
            break

    def finish() -> Answers:
        for client in held:
            client.request(0x004, {"LIFETIME": 0})
            client.close()
        return {}

    return refusals, finish


# --- TCP: idle connections per source and half-sent messages

MAX_CONNECTIONS_PER_SOURCE = 64
SLOW_WAIT_S = float(os.environ.get("BENCH_HOSTILE_SLOW_WAIT_S", "15"))
SLOW_POLL_S = 0.25


def tcp_config(port: int) -> dict[str, object]:
    """stunnerd_config with a TURN-TCP listener on the UDP listener's port (as coturn has)."""
    cfg = stunnerd_config(port)
    listeners = cfg["listeners"]
    assert isinstance(listeners, list)
    tcp = dict(listeners[0], name="bench/tcp", protocol="TURN-TCP")
    cfg["listeners"] = [*listeners, tcp]
    return cfg


def still_open(sock: socket.socket) -> bool:
    """Whether the server has neither closed nor reset the connection (nothing is read)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def open_tcp(port: int, source: str, count: int, first: bytes = b"") -> list[socket.socket]:
    socks: list[socket.socket] = []
    deadline = time.monotonic() + ATTACK_TIMEOUT_S
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(ANSWER_TIMEOUT_S)
        try:
            sock.bind((source, 0))
            sock.connect(("127.0.0.1", port))
            if first:
                sock.sendall(first)
            sock.setblocking(False)  # still_open must not wait
        except OSError:
            sock.close()
            continue
        socks.append(sock)
        if time.monotonic() > deadline:
            break
    return socks


def idle_tcp(port: int) -> tuple[Answers, Finish]:
    """10x the per-source cap of idle TCP connections from 127.0.0.2, held while honest clients
    run (well inside the 10 s first-message deadline)."""
    attempts = int(10 * MAX_CONNECTIONS_PER_SOURCE * LIMITS_SCALE)
    socks = open_tcp(port, "127.0.0.2", attempts)
    time.sleep(SETTLE_S)
    answers: Answers = {
        "connected": len(socks),
        "kept": sum(still_open(s) for s in socks),
    }

    def finish() -> Answers:
        kept = sum(still_open(s) for s in socks)
        for sock in socks:
            sock.close()
        return {"kept at end": kept}

    return answers, finish


def slowloris(port: int) -> tuple[Answers, Finish]:
    """The per-source cap of connections from 127.0.0.3, each 10 bytes of a STUN header and then
    nothing: when does the server close them (waiting at most SLOW_WAIT_S)? The ones still open
    are held until the honest clients are done."""
    partial = struct.pack("!HHI", ALLOCATE, 8, MAGIC)[:8] + os.urandom(2)
    socks = open_tcp(port, "127.0.0.3", int(MAX_CONNECTIONS_PER_SOURCE * LIMITS_SCALE), partial)
    started = time.monotonic()
    closed_after: dict[int, float] = {}
    while len(closed_after) < len(socks) and time.monotonic() - started < SLOW_WAIT_S:
        for i, sock in enumerate(socks):
            if i not in closed_after and not still_open(sock):
                closed_after[i] = time.monotonic() - started
        time.sleep(SLOW_POLL_S)

    def finish() -> Answers:
        for sock in socks:
            sock.close()
        return {}

    return slow_answers(len(socks), list(closed_after.values()), SLOW_WAIT_S), finish


def slow_answers(sent: int, closed_after_s: list[float], waited_s: float) -> Answers:
    """How many half-sent connections the server closed, when, and how many it still held."""
    answers: Answers = {"stalled": sent, f"closed by {waited_s:g} s": len(closed_after_s)}
    if closed_after_s:
        answers["median s to close"] = round(statistics.median(closed_after_s), 1)
    answers[f"open at {waited_s:g} s"] = sent - len(closed_after_s)
    return answers


@dataclass(frozen=True)
class Attack:
    """One attack and the servers it runs against: stunnerd's config and coturn's extra flags,
    and the credentials of honest client i (None: the static user)."""

    run: Callable[[int], tuple[Answers, Finish]]
    config: Callable[[int], dict[str, object]] = stunnerd_config
    coturn_extra: tuple[str, ...] = ()
    honest: Callable[[int], tuple[str, str]] | None = None


ATTACKS: dict[str, Attack] = {
    "auth-guess": Attack(guesses),
    "permissions": Attack(lambda port: hoard(port, "permissions")),
    "channels": Attack(lambda port: hoard(port, "channels")),
    "user-quota": Attack(over_quota, quota_config, tuple(quota_args()), honest_user),
    "tcp-per-source": Attack(idle_tcp, tcp_config),
    "tcp-slowloris": Attack(slowloris, tcp_config),
}


@dataclass
class Held:
    rss_before: int = 0
    rss_after: int = 0
    fds_before: int = 0
    fds_after: int = 0
    honest_sent: int = 0
    honest_lost: int = 0
    refusals: Answers = field(default_factory=dict)


def run_attack(pid: int, port: int, attack: Attack) -> Held:
    echo, echo_port = echo_server()
    honest = []
    for i in range(HONEST):
        username, password = attack.honest(i) if attack.honest else (USER, PASSWORD)
        honest.append(SyncTurn(port, password=password, username=username))
    held = Held()
    finish: Finish = _no_finish
    try:
        for client in honest:
            client.allocate()
            client.request(0x008, {"XOR-PEER-ADDRESS": ("127.0.0.1", echo_port)})
        held.rss_before, held.fds_before = rss_and_fds(pid)
        held.refusals, finish = attack.run(port)
        time.sleep(SETTLE_S)
        held.rss_after, held.fds_after = rss_and_fds(pid)
        for client in honest:
            held.honest_sent += HONEST_DATAGRAMS
            held.honest_lost += client.echo_loss(("127.0.0.1", echo_port), HONEST_DATAGRAMS)
    finally:
        held.refusals.update(finish())
        for client in honest:
            client.request(0x004, {"LIFETIME": 0})
            client.close()
        echo.close()
    return held


def limits_main() -> None:
    turnserver = shutil.which("turnserver") or "/usr/bin/turnserver"
    if not os.access(turnserver, os.X_OK):
        print("bench hostile limits: turnserver (coturn) is not installed; skipped")
    else:
        limits_report(turn_limits(turnserver))
    from bench import hostile_http

    hostile_http.main(LIMITS_SCALE)


def turn_limits(turnserver: str) -> dict[str, dict[str, Held]]:
    stunnerd = str(Path(sys.executable).with_name("stunnerd"))
    names = os.environ.get("BENCH_HOSTILE_ATTACKS")
    chosen = {k: v for k, v in ATTACKS.items() if not names or k in names.split(",")}
    results: dict[str, dict[str, Held]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp_name:
        tmp = Path(tmp_name)
        for name, attack in chosen.items():
            results[name] = {}
            coturn_port, stunnerd_port = free_port(), free_port()
            cfg = tmp / f"stunnerd-{name}.json"
            cfg.write_text(json.dumps(attack.config(stunnerd_port)))
            argv = coturn_args(turnserver, coturn_port, tmp, min_port=52000)
            argv += attack.coturn_extra
            with (
                process(argv, tmp / f"coturn-{name}.log") as coturn,
                process(
                    [stunnerd, "-c", str(cfg), "--bind", "127.0.0.1"], tmp / f"sd-{name}.log"
                ) as sd,
            ):
                wait_udp_listening(coturn_port, coturn, tmp / f"coturn-{name}.log")
                wait_udp_listening(stunnerd_port, sd, tmp / f"sd-{name}.log")
                results[name]["stunnerd"] = run_attack(sd.pid, stunnerd_port, attack)
                results[name]["coturn"] = run_attack(coturn.pid, coturn_port, attack)
    return results


def format_answers(answers: Answers) -> str:
    """``code: count`` pairs, codes in order then named counts as they came (0 is success, -1
    no answer)."""
    codes = sorted((k, v) for k, v in answers.items() if isinstance(k, int) and k >= 0)
    named = [(k, v) for k, v in answers.items() if not isinstance(k, int) or k < 0]
    return ", ".join(f"{'no answer' if k == -1 else k}: {v:g}" for k, v in [*codes, *named])


def held_row(name: str, server: str, h: Held) -> str:
    honest = f"{h.honest_lost:>5}/{h.honest_sent:<6}"
    return (
        f"{name:<16} {server:<9} {h.rss_before / 2**20:>9.1f}MB "
        f"{h.rss_after / 2**20:>8.1f}MB {h.fds_before:>4}->{h.fds_after:<4} "
        f"{honest}  {format_answers(h.refusals)}"
    )


def ratio_line(name: str, sd: Held, coturn: Held) -> str:
    sd_growth = sd.rss_after - sd.rss_before
    c_growth = coturn.rss_after - coturn.rss_before
    if c_growth > 0:
        return (
            f"RATIO limits_rss_growth[{name}] stunnerd/coturn = {sd_growth / c_growth:.2f} "
            f"(stunnerd {sd_growth / 1024:.0f} KiB, coturn {c_growth / 1024:.0f} KiB)"
        )
    return (
        f"limits_rss_growth[{name}]: coturn grew {c_growth / 1024:.0f} KiB; "
        f"stunnerd {sd_growth / 1024:.0f} KiB"
    )


HEADER = (
    f"{'attack':<16} {'server':<9} {'RSS before':>11} {'RSS after':>10} {'fds':>9} "
    f"{'honest loss':>12}  attacker answers (code: count)"
)


def limits_report(results: dict[str, dict[str, Held]]) -> None:
    print(
        f"limits: each attack from 127.0.0.2 (slowloris 127.0.0.3) at 10x stunnerd's default "
        f"(scale {LIMITS_SCALE:g}; user quota {USER_QUOTA} at both) beside {HONEST} honest "
        f"allocations, {HONEST_DATAGRAMS} echoed datagrams each after it"
    )
    print(HEADER)
    for name, by_server in results.items():
        for server, h in by_server.items():
            print(held_row(name, server, h))
    for name, by_server in results.items():
        print(ratio_line(name, by_server["stunnerd"], by_server["coturn"]))


def main() -> None:
    if PART in ("all", "cpu"):
        cpu_main()
    if PART in ("all", "limits"):
        limits_main()


if __name__ == "__main__":
    main()
