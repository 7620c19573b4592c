"""The turncat command: parse the arguments, resolve the server, run the tunnel, map errors.

Everything that can be checked before the first local client arrives is checked at startup:
the three addresses, the CDS lookup for `k8s://`, name resolution, and one trial session
(allocate, permit the peer, bind a channel, deallocate). So a wrong password, a forbidden peer
or a dead server ends turncat at once with one line and its own exit code, instead of as a
warning when the first packet arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from stunner_common import logs
from stunner_common.cli import (
    CDS_ADDR_ENV,
    DEFAULT_CDS_ADDRESS,
    add_version_argument,
)
from stunner_common.loglevel import apply_log_spec, parse_log_spec
from stunner_common.runtime import run as run_loop
from turncat.carrier import TlsOptions
from turncat.cds import cds_endpoint, kube_options, resolve_k8s
from turncat.errors import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    BadInputError,
    UnreachableError,
    exit_status,
)
from turncat.relay import Tunnel
from turncat.session import CredentialSource, DataCallback, LostCallback, TurnSession
from turncat.settings import TurncatSettings, load_settings
from turncat.uri import K8sTarget, LocalAddress, parse_local, parse_peer, parse_server

log = logging.getLogger(__name__)

USAGE_EXAMPLES = """\
examples:
  turncat udp://127.0.0.1:9000 'turn://user1:passwd1@127.0.0.1:3478?transport=udp' udp://10.0.0.5:9001
  turncat - k8s://stunner/udp-gateway:udp-listener udp://10.0.0.5:9001
  turncat tcp://127.0.0.1:8080 'turn://user1:passwd1@127.0.0.1:3478?transport=tcp' tcp://10.0.0.5:80
  turncat - 'turn://user1:passwd1@[::1]:3478?transport=udp' 'udp://[fd00::5]:9001'
exit codes: 0 ok, 1 other failure, 2 bad input, 3 authentication failed,
            4 peer forbidden, 5 server unreachable, 6 relay type not supported by the server,
            7 the server could not connect to the TCP peer
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="turncat",
        description="Tunnel a local UDP/TCP socket or stdin/stdout to a UDP peer, or to a TCP "
        "peer through an RFC 6062 TCP allocation, through a TURN server.",
        epilog=USAGE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_argument(p, "turncat")
    p.add_argument("local", help="udp://host:port, tcp://host:port or - (stdin/stdout)")
    p.add_argument(
        "server",
        help="turn://user:pass@host:port?transport=udp|tcp|tls|dtls, turns://… "
        "or k8s://namespace/gateway:listener",
    )
    p.add_argument("peer", help="udp://host:port or tcp://host:port ([ipv6] in brackets)")
    p.add_argument("-l", "--log", default="all:WARN", help="log spec, e.g. all:INFO,turncat:DEBUG")
    p.add_argument("-v", "--verbose", action="store_true", help="same as --log all:DEBUG")
    p.add_argument(
        "-i", "--insecure", action="store_true", help="do not verify TLS/DTLS certificates"
    )
    p.add_argument("--sni", help="server name to send and verify for TLS/DTLS")
    p.add_argument("--ca", metavar="FILE", help="CA bundle to verify the server's certificate")
    p.add_argument(
        "--cds-server-address",
        "--cds",
        dest="cds_server_address",
        default=None,
        help=f"CDS address (host:port or http://…) for k8s:// URIs [env {CDS_ADDR_ENV}; "
        f"else found through the kubeconfig; else {DEFAULT_CDS_ADDRESS}]",
    )
    add_kube_arguments(p)
    p.add_argument(
        "--cds-token-file",
        default=None,
        help="file holding the CDS bearer token [env CDS_TOKEN_FILE, else the token in CDS_TOKEN]",
    )
    p.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="namespace for k8s:///gateway:listener (default: default)",
    )
    return p


def add_kube_arguments(p: argparse.ArgumentParser) -> None:
    """kubectl's flags, for finding the CDS through the Kubernetes API."""
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig to find the CDS with when no CDS address is given "
        "[env KUBECONFIG; ~/.kube/config]",
    )
    p.add_argument("--context", default=None, help="the kubeconfig context to use")
    p.add_argument(
        "--cds-server-namespace",
        default=None,
        help="namespace of the CDS pod [env CDS_SERVER_NAMESPACE; default: any namespace]",
    )


def configure_logging(spec: str) -> None:
    if not parse_log_spec(spec):
        raise BadInputError(
            f"invalid log spec {spec!r}: expected scope:LEVEL[,scope:LEVEL...], e.g. all:INFO"
        )
    logs.configure_logging("text", logging.WARNING)
    apply_log_spec(spec)


def _static_credentials(username: str | None, password: str | None) -> CredentialSource:
    fixed = (username, password) if username and password else None

    def source() -> tuple[str, str] | None:
        return fixed

    return source


async def resolve_ip(host: str, port: int, what: str) -> tuple[str, int]:
    """Resolve a host name once, at startup; IPv4 is preferred for names that have both.

    An IPv6 peer gets an IPv6 relay (the session asks for one), since a relay only reaches
    peers of its own family.
    """
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        if what == "peer":
            raise BadInputError(f"cannot resolve peer host {host!r}: {exc}") from None
        raise UnreachableError(f"cannot resolve {what} host {host!r}: {exc}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    addr = infos[0][4]
    return str(addr[0]), int(addr[1])


async def run(args: argparse.Namespace, settings: TurncatSettings) -> None:
    local = parse_local(args.local)
    target = parse_server(args.server, args.namespace)
    peer_addr = parse_peer(args.peer)
    if peer_addr.transport == "tcp" and local.kind == "udp":
        raise BadInputError(
            f"a TCP peer ({args.peer}) carries a byte stream: the local address must be "
            "tcp://host:port or -"
        )
    tls = TlsOptions(insecure=args.insecure, sni=args.sni, ca_file=args.ca)

    credentials: CredentialSource
    if isinstance(target, K8sTarget):
        # The forward (if any) lives for the lookup only: nothing later asks the CDS.
        async with cds_endpoint(
            "turncat",
            settings.environ,
            address_flag=args.cds_server_address,
            token_file=args.cds_token_file,
            kube=kube_options(args),
            timeout_s=settings.cds_timeout_s,
        ) as cds:
            target, credentials = await resolve_k8s(
                target, cds.address, settings.cds_timeout_s, cds.token, env=settings.environ
            )
    else:
        credentials = _static_credentials(target.username, target.password)
    if peer_addr.transport == "tcp" and target.transport not in ("tcp", "tls"):
        raise BadInputError(
            f"a TCP peer ({args.peer}) is reached through a TCP allocation (RFC 6062), which "
            f"needs a TCP or TLS connection to the TURN server, not {target.transport.upper()}"
        )
    server = await resolve_ip(target.host, target.port, "TURN server")
    peer = await resolve_ip(peer_addr.host, peer_addr.port, "peer")
    if target.secure and not tls.sni and not tls.insecure and target.host != server[0]:
        tls = TlsOptions(insecure=False, sni=target.host, ca_file=tls.ca_file)
    transport = target.transport

    def factory(name: str, on_data: DataCallback, on_lost: LostCallback) -> TurnSession:
        return TurnSession(
            transport=transport,
            server=server,
            peer=peer,
            credentials=credentials,
            tls=tls,
            settings=settings,
            on_data=on_data,
            on_lost=on_lost,
            name=name,
            peer_transport=peer_addr.transport,
        )

    tunnel = Tunnel(local, factory, settings)
    await serve(tunnel, local)


async def serve(tunnel: Tunnel, local: LocalAddress) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        work: asyncio.Task[Any]
        if local.kind == "stdio":
            work = asyncio.create_task(tunnel.run_stdio(), name="stdio")
        else:
            work = asyncio.create_task(listen(tunnel, stop), name="listen")
        stopper = asyncio.create_task(stop.wait(), name="signal")
        try:
            await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (work, stopper):
                t.cancel()
            results = await asyncio.gather(work, stopper, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r
    finally:
        await tunnel.aclose()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def listen(tunnel: Tunnel, stop: asyncio.Event) -> None:
    await preflight(tunnel)
    await tunnel.start()
    await stop.wait()


async def preflight(tunnel: Tunnel) -> None:
    """Open and close one session so credentials, peer and server are checked up front; for a
    TCP peer that includes one connection to it (Connect and ConnectionBind)."""
    session = tunnel.new_session("preflight", lambda _data: None, lambda _exc: None)
    try:
        await session.open()
        if session.peer_transport == "tcp":
            _reader, writer = await session.connect()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    finally:
        await tunnel.end_session(session)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.ca and not os.path.isfile(args.ca):
        print(f"turncat: CA file {args.ca!r} does not exist", file=sys.stderr)
        return EXIT_BAD_INPUT

    def body() -> int:
        configure_logging("all:DEBUG" if args.verbose else args.log)
        run_loop(run(args, load_settings()))
        return EXIT_OK

    return exit_status("turncat", body, interrupted=EXIT_OK)


__all__ = ["EXIT_BAD_INPUT", "add_kube_arguments", "build_parser", "main"]
