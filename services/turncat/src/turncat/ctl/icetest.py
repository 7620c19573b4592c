"""Allocate through every listener of a Gateway and time probes to an echo backend.

For each listener the CDS lists, a TURN session is opened to its public address (or its
listener address when it has no public one) with the credentials of the config's auth section
(static, or TURN REST ones minted from the shared secret), the echo peer is permitted and bound,
and `count` numbered probes are sent `interval_s` apart. Echoes are matched by number; what has
not come back `wait_s` after the last probe is lost. The result per listener: sent, received,
loss, and the round-trip time's p50 and p99 (nearest rank), or the one-line error that stopped
it (authentication, a forbidden peer, an unreachable listener).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import struct
import sys
import time
from typing import Any

from stunner_common.config import ListenerConfig, StunnerConfig
from turncat.carrier import TlsOptions
from turncat.cds import credential_source
from turncat.ctl.summary import dump, percentile, probe_summary
from turncat.errors import (
    EXIT_OK,
    BadInputError,
    LookupFailedError,
    TurncatError,
    UnreachableError,
)
from turncat.session import TurnSession
from turncat.settings import TurncatSettings
from turncat.uri import TRANSPORT_BY_PROTOCOL, parse_peer

PROBE = struct.Struct("!8sI")  # a run tag, then the probe number
_UNSPECIFIED = ("", "0.0.0.0", "::")


def listener_target(listener: ListenerConfig) -> tuple[str, int]:
    """Where a client reaches this listener: its public address, else its own address."""
    if listener.public_address and listener.public_port:
        return listener.public_address, listener.public_port
    addr = listener.address or ""
    if addr in _UNSPECIFIED or addr.startswith("$") or addr.startswith("__"):
        raise LookupFailedError("the listener has no public address yet")
    return addr, listener.port


async def resolve_address(host: str, port: int, family: int = socket.AF_UNSPEC) -> tuple[str, int]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnreachableError(f"cannot resolve {host!r}: {exc}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0]), int(infos[0][4][1])


class _Echoes:
    """Numbered probes out, their echoes matched back by run tag and number."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.tag = os.urandom(8)
        self.sent = 0
        self.sent_at: dict[int, float] = {}
        self.rtts: list[float] = []
        self.all_back = asyncio.Event()

    @staticmethod
    def clock() -> float:
        return time.perf_counter()  # uvloop's loop.time() has millisecond steps: too coarse

    def probe(self, number: int) -> bytes:
        self.sent_at[number] = self.clock()
        self.sent += 1
        return PROBE.pack(self.tag, number)

    def on_data(self, data: bytes) -> None:
        if len(data) != PROBE.size:
            return
        got_tag, number = PROBE.unpack(data)
        started = self.sent_at.pop(number, None) if got_tag == self.tag else None
        if started is not None:
            self.rtts.append(self.clock() - started)
            if len(self.rtts) == self.count:
                self.all_back.set()

    def summary(self, max_loss: float, error: str | None) -> dict[str, Any]:
        rtts = sorted(self.rtts)
        loss = round(1 - len(rtts) / self.sent, 4) if self.sent else 1.0
        return {
            "sent": self.sent,
            "received": len(rtts),
            "loss": loss,
            "rtt_p50_ms": round(percentile(rtts, 0.50) * 1000, 3) if rtts else None,
            "rtt_p99_ms": round(percentile(rtts, 0.99) * 1000, 3) if rtts else None,
            "ok": error is None and bool(rtts) and loss <= max_loss,
            "error": error,
        }


def _session(
    config: StunnerConfig,
    listener: ListenerConfig,
    peer: tuple[str, int],
    server: tuple[str, int],
    host: str,
    tls: TlsOptions,
    settings: TurncatSettings,
    echoes: _Echoes,
) -> TurnSession:
    transport = TRANSPORT_BY_PROTOCOL[listener.protocol]
    return TurnSession(
        transport=transport,
        server=server,
        peer=peer,
        credentials=credential_source(config),
        tls=tls if tls.sni or _is_ip(host) else TlsOptions(tls.insecure, host, tls.ca_file),
        settings=settings,
        on_data=echoes.on_data,
        name=f"icetest {listener.name}",
    )


async def probe_listener(
    config: StunnerConfig,
    listener: ListenerConfig,
    peer: tuple[str, int],
    *,
    count: int,
    interval_s: float,
    wait_s: float,
    max_loss: float,
    tls: TlsOptions,
    settings: TurncatSettings,
) -> dict[str, Any]:
    """One listener's result as a JSON-ready dict (`ok` says whether it passed)."""
    result: dict[str, Any] = {
        "gateway": config.admin.name,
        "listener": listener.name,
        "protocol": listener.protocol,
        "server": None,
        "peer": f"{peer[0]}:{peer[1]}",
    }
    echoes = _Echoes(count)
    error: str | None = None
    session: TurnSession | None = None
    try:
        transport = TRANSPORT_BY_PROTOCOL.get(listener.protocol)
        if transport is None:
            raise LookupFailedError(f"unknown listener protocol {listener.protocol}")
        host, port = listener_target(listener)
        result["server"] = f"{transport}://{host}:{port}"
        server = await resolve_address(host, port)
        session = _session(config, listener, peer, server, host, tls, settings, echoes)
        await session.open()
        for number in range(count):
            session.send(echoes.probe(number))
            if number + 1 < count:
                await asyncio.sleep(interval_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await echoes.all_back.wait()
    except TurncatError as exc:
        error = str(exc)
    finally:
        if session is not None:
            await session.close()
    return result | echoes.summary(max_loss, error)


def _is_ip(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True


class IcetestFailedError(TurncatError):
    """At least one listener failed its icetest."""


def check_icetest_args(args: argparse.Namespace) -> None:
    """The icetest flags, checked before the CDS is asked anything."""
    if args.count < 1 or args.interval_ms < 0 or args.wait_ms < 0 or not 0 <= args.max_loss <= 1:
        raise BadInputError(
            "--count must be at least 1, --interval-ms and --wait-ms not negative, "
            "--max-loss between 0 and 1"
        )
    if parse_peer(args.peer).transport != "udp":
        raise BadInputError(
            f"the icetest peer must be a UDP echo (udp://host:port), not {args.peer}"
        )


async def cmd_icetest(
    args: argparse.Namespace, configs: list[StunnerConfig], settings: TurncatSettings
) -> int:
    output = getattr(args, "output", "summary")
    check_icetest_args(args)
    peer_addr = parse_peer(args.peer)
    try:
        peer = await resolve_address(peer_addr.host, peer_addr.port)
    except UnreachableError as exc:
        raise BadInputError(f"icetest peer: {exc}") from None
    tls = TlsOptions(insecure=args.insecure, ca_file=args.ca)
    failed = 0
    total = 0
    for config in configs:
        if output == "summary":
            print(f"Gateway: {config.admin.name}")
        for listener in config.listeners:
            total += 1
            result = await probe_listener(
                config,
                listener,
                peer,
                count=args.count,
                interval_s=args.interval_ms / 1000,
                wait_s=args.wait_ms / 1000,
                max_loss=args.max_loss,
                tls=tls,
                settings=settings,
            )
            failed += not result["ok"]
            print(probe_summary(result) if output == "summary" else dump([result], output))
            sys.stdout.flush()
    if total == 0:
        raise LookupFailedError("no listener to test: the selected Gateways have none")
    if failed:
        raise IcetestFailedError(f"icetest failed on {failed} of {total} listener(s)")
    return EXIT_OK
