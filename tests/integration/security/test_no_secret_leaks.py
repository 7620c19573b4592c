"""No secret leaves the place it belongs: not in a log at DEBUG, `/status`, metrics or errors.

The whole stack runs at DEBUG (operator in local mode, CDS, stunnerd watching the CDS) with a
static password and a TURN-TLS listener whose key comes from a Secret; turncat relays through it
(at DEBUG too), a client fails authentication, and then every log line and every diagnostic
endpoint is searched for the secrets. A second stunnerd (file config, ephemeral auth, metrics
on) does the same with a TURN REST shared secret. The CDS config API is where configs (and so
credentials) belong: it is not searched; it is protected by the bearer token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from aioice import stun
from aioice.turn import create_turn_endpoint

from stunner_common.auth import ephemeral_credentials
from stunner_common.config import self_signed_pair
from support.echo import echo_peer
from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess
from support.security_stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BIN = Path(sys.executable).parent


def key_needles(key_b64: str) -> list[str]:
    """Pieces of a private key as it may travel: base64 of the PEM, and a line of the PEM."""
    pem = base64.b64decode(key_b64).decode()
    body = [line for line in pem.splitlines() if line and not line.startswith("-----")]
    return [key_b64[40:100], body[len(body) // 2]]


def add_tls_listener(stack: Stack, cert_b64: str, key_b64: str) -> int:
    port = free_udp_tcp_port()
    gateways = stack.manifests / "gateways.yaml"
    text = gateways.read_text()
    udp_listener = f"      port: {stack.udp_port}\n      protocol: TURN-UDP\n"
    assert udp_listener in text
    tls_listener = (
        f"    - name: tls-listener\n      port: {port}\n      protocol: TURN-TLS\n"
        "      tls:\n        mode: Terminate\n        certificateRefs:\n"
        "          - kind: Secret\n            name: tls-secret\n"
    )
    gateways.write_text(text.replace(udp_listener, udp_listener + tls_listener))
    (stack.manifests / "tls-secret.yaml").write_text(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: tls-secret\n  namespace: stunner\n"
        f"type: kubernetes.io/tls\ndata:\n  tls.crt: {cert_b64}\n  tls.key: {key_b64}\n"
    )
    return port


async def turncat(*args: str) -> tuple[int, bytes, bytes]:
    """turncat at DEBUG relaying one line (async: the echo peer runs in this event loop)."""
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "turncat"),
        "-v",
        *args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate(b"hello\n")
    return proc.returncode or 0, out, err


def leaks(where: str, text: str, needles: dict[str, str]) -> list[str]:
    return [f"{name} in {where}" for name, value in needles.items() if value in text]


async def test_no_secret_in_any_log_or_endpoint_of_a_full_run_at_debug(tmp_path: Path) -> None:
    cert_b64, key_b64 = self_signed_pair("127.0.0.1")
    stack = Stack(tmp_path)
    tls_port = add_tls_listener(stack, cert_b64, key_b64)
    needles = stack.secrets.values()
    for i, piece in enumerate(key_needles(key_b64)):
        needles[f"TLS key ({i})"] = piece
    found: list[str] = []
    try:
        stack.start_all()
        await stack.wait_status(lambda s: len(s.get("listeners", [])) == 2, "both listeners")
        async with echo_peer() as (_echo, peer):
            target = f"udp://{peer[0]}:{peer[1]}"
            user, password = stack.secrets.user, stack.secrets.password
            good = await turncat(
                "-", f"turn://{user}:{password}@127.0.0.1:{stack.udp_port}", target
            )
            assert good[1] == b"hello\n", good[2].decode()[-2000:]
            tls = await turncat(
                "--insecure",
                "-",
                f"turns://{user}:{password}@127.0.0.1:{tls_port}?transport=tcp",
                target,
            )
            assert tls[1] == b"hello\n", tls[2].decode()[-2000:]
            wrong = f"{password}-wrong"
            bad = await turncat("-", f"turn://{user}:{wrong}@127.0.0.1:{stack.udp_port}", target)
            assert bad[0] != 0
            needles["the wrong password"] = wrong
            for name, run in (("turncat", good), ("turncat tls", tls), ("turncat 401", bad)):
                found += leaks(name, (run[1] + run[2]).decode(errors="replace"), needles)
        http = stack.http
        bearer = {"Authorization": f"Bearer {stack.cds_token}"}
        health = f"http://127.0.0.1:{stack.health_port}"
        cds = f"http://127.0.0.1:{stack.cds_ports[0]}"
        for url in (
            f"{health}/status",
            f"{health}/live",
            f"{health}/ready",
            f"{cds}/metrics",
            f"{cds}/healthz",
            f"{cds}/readyz",
            f"{cds}/api/v1/configs/stunner/missing",
            f"{cds}/api/v1/nothing",
        ):
            for headers in ({}, {"Authorization": "Bearer wrong"}, bearer):
                reply = await http.get(url, headers=headers)
                found += leaks(url, reply.text, needles)
        # the canary: the secrets are where they belong (the config API), in the form searched
        configs = (await http.get(f"{cds}/api/v1/configs", headers=bearer)).text
        assert stack.secrets.password in configs
        assert needles["TLS key (0)"] in configs
        status = await stack.status()
        assert status["auth"]["type"] == "static"  # the status is there, only without secrets
    finally:
        await stack.close()
    for name, body in stack.all_logs().items():
        assert body, f"{name} logged nothing"
        found += leaks(f"log {name}", body, needles)
    assert "DEBUG" in "".join(stack.all_logs().values())
    assert not found, found


async def test_no_shared_secret_in_logs_status_or_metrics_of_an_ephemeral_stunnerd(
    tmp_path: Path,
) -> None:
    secret = f"shared-{time.time_ns()}-Qw"
    health, metrics, port = free_port(), free_port(), free_udp_tcp_port()
    config = {
        "version": "v1",
        "admin": {
            "name": "ns/gw",
            "loglevel": "all:DEBUG",
            "healthcheck_endpoint": f"http://127.0.0.1:{health}",
            "metrics_endpoint": f"http://127.0.0.1:{metrics}/metrics",
        },
        "auth": {"type": "ephemeral", "realm": "r", "credentials": {"secret": secret}},
        "listeners": [
            {
                "name": "udp",
                "protocol": "TURN-UDP",
                "address": "127.0.0.1",
                "port": port,
                "routes": ["echo"],
            }
        ],
        "clusters": [{"name": "echo", "type": "STATIC", "endpoints": ["127.0.0.1"]}],
    }
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(config))
    proc = ServerProcess(
        [
            sys.executable,
            "-m",
            "stunnerd",
            "-c",
            str(path),
            "--bind",
            "127.0.0.1",
            "-l",
            "all:DEBUG",
        ],
        log_path=tmp_path / "stunnerd.log",
    )
    user, password = ephemeral_credentials(secret, ttl_s=600, now=time.time(), user_id="alice")
    found: list[str] = []
    try:
        async with httpx.AsyncClient(timeout=2.0) as http, echo_peer() as (_echo, peer):
            deadline = time.monotonic() + 20
            while True:
                try:
                    if (await http.get(f"http://127.0.0.1:{health}/ready")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, proc.output()
                await asyncio.sleep(0.05)
            received: asyncio.Queue[bytes] = asyncio.Queue()

            class Receiver(asyncio.DatagramProtocol):
                def datagram_received(self, data: bytes, addr: object) -> None:
                    received.put_nowait(data)

            transport, _ = await create_turn_endpoint(
                Receiver, server_addr=("127.0.0.1", port), username=user, password=password
            )
            try:
                transport.sendto(b"ping", peer)
                async with asyncio.timeout(10):
                    assert await received.get() == b"ping"
            finally:
                transport.close()
            with pytest.raises(stun.TransactionFailed, match="401"):
                await create_turn_endpoint(
                    Receiver, server_addr=("127.0.0.1", port), username=user, password="bad"
                )
            for url in (
                f"http://127.0.0.1:{health}/status",
                f"http://127.0.0.1:{metrics}/metrics",
            ):
                reply = await http.get(url)
                assert reply.status_code == 200, url
                found += leaks(url, reply.text, {"shared secret": secret, "password": password})
    finally:
        proc.stop()
    log = proc.output()
    assert "DEBUG" in log
    found += leaks("stunnerd log", log, {"shared secret": secret, "password": password})
    assert not found, found
