"""The compose stack from the images: built, started with podman-compose, used, edited, torn down.

Runs what a user runs (`make images`, `make compose-up`) on free ports and a copy of
examples/local: turncat relays through both example Gateways to the echo backend, an edited
manifest moves a Gateway to another port and the relay follows it, the auth service's /ice lists
the Gateways, and `down -v` leaves no container and no volume behind. Slow (image builds): CI
runs it with `pytest -m compose`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.local_manifests import copy_local_examples
from support.ports import free_port, free_udp_tcp_port

pytestmark = [pytest.mark.compose, pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "scripts"))
import images  # type: ignore[import-not-found]  # noqa: E402


def podman(*args: str, env: dict[str, str]) -> str:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=env, check=True, timeout=60
    ).stdout


def turncat_echo(uri: str, echo_port: int, line: bytes, timeout_s: float = 120) -> bytes:
    """turncat through `uri` until the echo comes back (the stack may still be starting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = subprocess.run(
            [str(BIN / "turncat"), "-", uri, f"udp://127.0.0.1:{echo_port}"],
            input=line,
            capture_output=True,
            timeout=20,
            check=False,
        )
        if result.returncode == 0 and result.stdout == line:
            return result.stdout
        assert time.monotonic() < deadline, result.stderr.decode()
        time.sleep(1)


@pytest.fixture
def compose_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    if not shutil.which("podman") or not (BIN / "podman-compose").exists():
        pytest.skip("podman and podman-compose are needed (apt-get install podman runc)")
    env = images.engine_env("podman")
    images.build(list(images.IMAGES))
    udp, tcp = free_udp_tcp_port(), free_udp_tcp_port()
    manifests = copy_local_examples(tmp_path / "manifests", udp, tcp)
    env.update(
        STUNNER_MANIFESTS=str(manifests),
        STUNNER_REDIS_PORT=str(free_port()),
        STUNNER_CDS_PORT=str(free_port()),
        STUNNER_AUTH_PORT=str(free_port()),
        STUNNER_UDP_HEALTH_PORT=str(free_port()),
        STUNNER_TCP_HEALTH_PORT=str(free_port()),
        STUNNER_OPERATOR_HEALTH_PORT=str(free_port()),
        STUNNER_UDP_METRICS_PORT=str(free_port()),
        STUNNER_TCP_METRICS_PORT=str(free_port()),
        STUNNER_OPERATOR_METRICS_PORT=str(free_port()),
        STUNNER_ECHO_PORT=str(free_port(socket.SOCK_DGRAM)),
        STUNNER_TEST_UDP=str(udp),
        STUNNER_TEST_TCP=str(tcp),
    )
    project = f"stunner-test-{os.getpid()}"
    compose = [str(BIN / "podman-compose"), "-p", project, "-f", str(ROOT / "docker-compose.yml")]
    env["STUNNER_TEST_PROJECT"] = project
    try:
        subprocess.run([*compose, "up", "-d"], env=env, check=True, timeout=600, cwd=ROOT)
        yield env
    finally:
        subprocess.run(
            [*compose, "down", "-v", "-t", "10"], env=env, timeout=300, cwd=ROOT, check=False
        )


def test_the_compose_stack_relays_follows_a_manifest_edit_and_leaves_nothing(
    compose_env: dict[str, str],
) -> None:
    env = compose_env
    echo = int(env["STUNNER_ECHO_PORT"])
    udp = f"turn://user-1:pass-1@127.0.0.1:{env['STUNNER_TEST_UDP']}?transport=udp"
    tcp = f"turn://user-1:pass-1@127.0.0.1:{env['STUNNER_TEST_TCP']}?transport=tcp"
    assert turncat_echo(udp, echo, b"compose udp\n") == b"compose udp\n"
    assert turncat_echo(tcp, echo, b"compose tcp\n") == b"compose tcp\n"

    moved = free_udp_tcp_port()
    gateways = Path(env["STUNNER_MANIFESTS"]) / "gateways.yaml"
    gateways.write_text(
        gateways.read_text().replace(f"port: {env['STUNNER_TEST_UDP']}", f"port: {moved}")
    )
    moved_uri = f"turn://user-1:pass-1@127.0.0.1:{moved}?transport=udp"
    assert turncat_echo(moved_uri, echo, b"moved\n", timeout_s=60) == b"moved\n"

    ice_url = f"http://127.0.0.1:{env['STUNNER_AUTH_PORT']}/ice?service=turn&namespace=stunner"
    with urllib.request.urlopen(ice_url, timeout=5) as resp:
        ice = json.load(resp)
    assert ice["iceServers"][0]["username"] == "user-1"
    assert sorted(ice["iceServers"][0]["urls"]) == sorted(
        [
            f"turn:127.0.0.1:{env['STUNNER_TEST_TCP']}?transport=tcp",
            f"turn:127.0.0.1:{moved}?transport=udp",
        ]
    )

    # Every container is healthy by its own healthcheck.
    project = env["STUNNER_TEST_PROJECT"]
    names = podman(
        "ps",
        "--filter",
        f"label=io.podman.compose.project={project}",
        "--format",
        "{{.Names}}",
        env=env,
    ).split()
    assert len(names) == 7, names
    for name in names:
        assert (
            subprocess.run(
                ["podman", "healthcheck", "run", name],
                env=env,
                capture_output=True,
                timeout=30,
                check=False,
            ).returncode
            == 0
        ), name

    bin_compose = [
        str(BIN / "podman-compose"),
        "-p",
        project,
        "-f",
        str(ROOT / "docker-compose.yml"),
    ]
    subprocess.run(
        [*bin_compose, "down", "-v", "-t", "10"], env=env, check=True, timeout=300, cwd=ROOT
    )
    left = podman(
        "ps",
        "-a",
        "--filter",
        f"label=io.podman.compose.project={project}",
        "--format",
        "{{.Names}}",
        env=env,
    ).split()
    volumes = [
        v
        for v in podman("volume", "ls", "--format", "{{.Name}}", env=env).split()
        if v.startswith(project)
    ]
    assert (left, volumes) == ([], [])
