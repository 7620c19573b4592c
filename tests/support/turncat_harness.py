"""Pieces for turncat's end-to-end tests: a UDP echo peer, coturn, certificates, the CLI.

The echo peer records every source address it hears from, so a test can tell how many distinct
TURN relays (allocations) reached it. coturn runs on loopback with a free port and its own
scratch database. turncat runs as a real subprocess; readiness is its "listening on" log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from support.ports import LOOPBACK, free_udp_tcp_port
from support.processes import ServerProcess, wait_for_tcp, which

USER, PASSWORD, SECRET, REALM = "user1", "passwd1", "my-secret", "stunner.l7mp.io"


class UdpClient(asyncio.DatagramProtocol):
    """A local client of turncat: sends datagrams and queues the replies."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.replies.put_nowait(data)

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.sendto(data)

    async def roundtrip(self, data: bytes, timeout_s: float = 5.0, retries: int = 3) -> bytes:
        """Send and wait for a reply, resending a few times (UDP may drop the first ones)."""
        for _ in range(retries):
            self.send(data)
            try:
                async with asyncio.timeout(timeout_s / retries):
                    return await self.replies.get()
            except TimeoutError:
                continue
        raise TimeoutError(f"no reply to {data!r}")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def udp_client(host: str, port: int) -> UdpClient:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_datagram_endpoint(UdpClient, remote_addr=(host, port))
    return proto


def self_signed_cert(directory: Path, host: str = LOOPBACK) -> tuple[Path, Path]:
    """A self-signed certificate for `host` (IP SAN and DNS localhost); returns (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "turncat-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class Coturn:
    port: int
    tls_port: int | None
    proc: ServerProcess
    cert: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)
    host: str = LOOPBACK

    def uri(self, transport: str = "udp", user: str = USER, password: str = PASSWORD) -> str:
        port = self.tls_port if transport in ("tls", "dtls") else self.port
        userinfo = f"{quote(user, safe='')}:{quote(password, safe='')}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"turn://{userinfo}@{host}:{port}?transport={transport}"


def turnserver_binary() -> str | None:
    return which("turnserver")


@contextlib.contextmanager
def coturn(
    tmp: Path,
    *,
    secret: str | None = None,
    tls: bool = False,
    extra: Sequence[str] = (),
    host: str = LOOPBACK,
) -> Iterator[Coturn]:
    """coturn on loopback with a static user (or a TURN REST secret), optionally TLS/DTLS.

    It listens on `host` (127.0.0.1 or ::1) and relays from both 127.0.0.1 and ::1, so peers of
    either family can be reached; UDP and TCP (RFC 6062) relays are both enabled.
    """
    binary = turnserver_binary()
    if binary is None:
        import pytest

        pytest.skip("coturn's turnserver is not installed")
    port = free_udp_tcp_port(host)
    argv = [
        binary,
        "-n",
        "--no-cli",
        "--log-file=stdout",
        "--simple-log",
        "-v",
        f"--listening-ip={host}",
        f"--relay-ip={LOOPBACK}",
        "--relay-ip=::1",
        f"--listening-port={port}",
        "--allow-loopback-peers",
        f"--realm={REALM}",
        "--fingerprint",
        f"--db={tmp / 'turndb'}",
        f"--pidfile={tmp / 'turnserver.pid'}",
        "--relay-threads=1",
    ]
    if secret:
        argv += ["--use-auth-secret", f"--static-auth-secret={secret}"]
    else:
        argv += ["--lt-cred-mech", f"--user={USER}:{PASSWORD}"]
    tls_port = None
    cert = None
    if tls:
        cert, key = self_signed_cert(tmp)
        tls_port = free_udp_tcp_port(host)
        argv += [f"--tls-listening-port={tls_port}", f"--cert={cert}", f"--pkey={key}"]
    else:
        argv += ["--no-tls", "--no-dtls"]
    argv += list(extra)
    proc = ServerProcess(argv, log_path=tmp / "coturn.log")
    try:
        wait_for_tcp(host, port, proc=proc)
        if tls_port:
            wait_for_tcp(host, tls_port, proc=proc)
        yield Coturn(port, tls_port, proc, cert, host=host)
    finally:
        proc.stop()


class Turncat:
    """A subprocess (turncat, or a server) whose stderr is collected by an owned reader task;
    it counts as ready once a line contains `ready_text`."""

    def __init__(self, proc: asyncio.subprocess.Process, ready_text: str = "listening on") -> None:
        self.proc = proc
        self.ready_text = ready_text
        self.lines: list[str] = []
        self._listening = asyncio.Event()
        self._new_line = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name="turncat-stderr")

    async def _read(self) -> None:
        stream = self.proc.stderr if self.proc.stderr is not None else self.proc.stdout
        assert stream is not None
        async for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            self._new_line.set()
            if self.ready_text in line:
                self._listening.set()

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    async def wait_listening(self, timeout_s: float = 20.0) -> None:
        waiter = asyncio.create_task(self._listening.wait(), name="turncat-listening")
        exited = asyncio.create_task(self.proc.wait(), name="turncat-exited")
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wait({waiter, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            exited.cancel()
            await asyncio.gather(waiter, exited, return_exceptions=True)
        if not self._listening.is_set():
            await self._drain()
            raise AssertionError(f"turncat exited {self.proc.returncode}:\n{self.stderr}")

    async def wait_for_line(self, text: str, count: int = 1, timeout_s: float = 20.0) -> None:
        """Wait until `count` stderr lines contain `text`."""
        async with asyncio.timeout(timeout_s):
            while sum(text in line for line in self.lines) < count:
                if self.proc.returncode is not None:
                    raise AssertionError(f"turncat exited waiting for {text!r}:\n{self.stderr}")
                self._new_line.clear()
                await self._new_line.wait()

    async def _drain(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self._reader

    async def wait(self, timeout_s: float = 30.0) -> int:
        async with asyncio.timeout(timeout_s):
            rc = await self.proc.wait()
        await self._drain()
        return rc

    async def stop(self, sig: int = signal.SIGINT, timeout_s: float = 15.0) -> int:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                return await self.wait(timeout_s)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
                raise
        await self._drain()
        return self.proc.returncode

    async def aclose(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


async def start_logged(
    argv: Sequence[str], ready_text: str, env: dict[str, str] | None = None
) -> Turncat:
    """Start any program whose stderr says when it is ready (e.g. stunnerd)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    return Turncat(proc, ready_text)


async def start_turncat(
    *args: str, env: dict[str, str] | None = None, stdin: int | None = None
) -> Turncat:
    full_env = {**os.environ, **(env or {})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turncat",
        "-l",
        "all:INFO",
        *args,
        stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=full_env,
    )
    return Turncat(proc)


@contextlib.asynccontextmanager
async def turncat(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[Turncat]:
    """A listening turncat (UDP/TCP local mode), killed by PID if the test did not stop it."""
    tc = await start_turncat(*args, env=env)
    try:
        await tc.wait_listening()
        yield tc
    finally:
        await tc.aclose()


async def run_turncat(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run turncat to completion (for error cases); returns (exit code, stderr)."""
    tc = await start_turncat(*args, env=env)
    try:
        rc = await tc.wait()
    finally:
        await tc.aclose()
    return rc, tc.stderr


async def tcp_roundtrip(port: int, payload: bytes, host: str = LOOPBACK) -> bytes:
    """Send payload on a new TCP connection to host:port and read as many bytes back."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(payload)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.readexactly(len(payload))
    finally:
        writer.close()
        await writer.wait_closed()


async def stdin_roundtrip(server_uri: str, peer: str, line: bytes) -> tuple[bytes, int, str]:
    """One line through turncat in stdin mode: (the reply line, exit code, stderr)."""
    tc = await start_turncat("-", server_uri, peer, stdin=asyncio.subprocess.PIPE)
    try:
        assert tc.proc.stdin is not None
        assert tc.proc.stdout is not None
        tc.proc.stdin.write(line)
        await tc.proc.stdin.drain()
        async with asyncio.timeout(10):
            reply = await tc.proc.stdout.readline()
        tc.proc.stdin.close()
        rc = await tc.wait()
    finally:
        await tc.aclose()
    return reply, rc, tc.stderr


@dataclass
class TcpEcho:
    """A TCP echo peer: `connections` counts accepted connections, `sources` their addresses."""

    host: str
    port: int
    connections: int = 0
    sources: list[tuple[str, int]] = field(default_factory=list)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


@contextlib.asynccontextmanager
async def tcp_echo(host: str = LOOPBACK) -> AsyncIterator[TcpEcho]:
    """A TCP echo server on `host`, port 0; every connection echoes until its client closes."""
    echo = TcpEcho(host, 0)
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            handlers.add(me)
        echo.connections += 1
        echo.sources.append(writer.get_extra_info("peername")[:2])
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
            handlers.discard(me)

    server = await asyncio.start_server(handle, host, 0)
    echo.port = server.sockets[0].getsockname()[1]
    try:
        yield echo
    finally:
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()
