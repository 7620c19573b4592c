"""STUN mode end to end: the operator renders `stunMode: true`, stunnerd serves that config.

coturn's `turnutils_stunclient` gets its Binding answered; `turnutils_uclient` gets its Allocate
refused on every listener kind, with upstream's code 400 Bad Request (pion/turn answers 400 when
no auth handler is set, "so clients don't retry").
"""

from __future__ import annotations

import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from stunner_common.crds import GatewayConfig
from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, UDP_GATEWAY, objects_from_yaml
from support.processes import which
from support.stun import parse
from support.stunnerd_process import Stunnerd, start_stunnerd

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

BINDING = bytes.fromhex("0001 0000 2112a442") + bytes(range(12))


def tool(name: str) -> str:
    binary = which(name)
    if binary is None:
        pytest.skip(f"{name} (coturn) is not installed")
    return binary


def rendered_stun_mode_auth() -> dict[str, object]:
    """The auth section the operator renders for a GatewayConfig with `stunMode: true`."""
    text = HIERARCHY.replace("spec: {authType", "spec: {stunMode: true, authType")
    renderer = Renderer()
    renderer.apply(objects_from_yaml(text) + objects_from_yaml(UDP_GATEWAY))
    gwconfig = next(o for o in objects_from_yaml(text) if isinstance(o, GatewayConfig))
    assert gwconfig.spec.stun_mode
    config = renderer.configs()["stunner/gw"]
    return config.auth.to_dict()


@pytest.fixture(scope="module")
def stun_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stunnerd]:
    auth = rendered_stun_mode_auth()
    assert auth["type"] == "none"
    assert auth["credentials"] == {}
    server = start_stunnerd(tmp_path_factory.mktemp("stun-mode"), auth)
    yield server
    server.proc.stop()


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_stunclient_gets_its_binding_answered(stun_only: Stunnerd) -> None:
    port = stun_only.ports["TURN-UDP"]
    done = run([tool("turnutils_stunclient"), "-p", str(port), "127.0.0.1"])
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "UDP reflexive addr: 127.0.0.1:" in out, out


def _binding_over(sock: socket.socket) -> bytes:
    sock.sendall(BINDING)
    data = b""
    while len(data) < 20 or len(data) < 20 + int.from_bytes(data[2:4], "big"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("proto", ["TURN-TCP", "TURN-TLS"])
def test_stream_listeners_answer_binding_too(stun_only: Stunnerd, proto: str) -> None:
    port = stun_only.ports[proto]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        if proto == "TURN-TLS":
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            with ctx.wrap_socket(raw) as tls:
                answer = parse(_binding_over(tls))
        else:
            answer = parse(_binding_over(raw))
    assert answer.klass == 0x100, answer  # success response
    assert answer.attributes["XOR-MAPPED-ADDRESS"][0] == "127.0.0.1"


UCLIENT_TRANSPORTS = {
    "TURN-UDP": [],
    "TURN-TCP": ["-t"],
    "TURN-TLS": ["-t", "-S"],
    "TURN-DTLS": ["-S"],
}


@pytest.mark.parametrize("proto", list(UCLIENT_TRANSPORTS))
def test_uclient_allocate_is_refused_with_400(
    stun_only: Stunnerd, proto: str, tmp_path: Path
) -> None:
    port = stun_only.ports[proto]
    argv = [
        tool("turnutils_uclient"), *UCLIENT_TRANSPORTS[proto],
        "-p", str(port), "-e", "127.0.0.1", "-r", "9", "-n", "1", "-m", "1",
        "-u", "user1", "-w", "passwd1", "127.0.0.1",
    ]  # fmt: skip
    done = run(argv)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "error 400" in out, out[-3000:]
