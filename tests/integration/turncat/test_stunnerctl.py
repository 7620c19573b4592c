"""stunnerctl against the real stack: Redis, the operator on examples/local, a CDS that requires
a bearer token, a stunnerd for the UDP Gateway (none for the TCP one) and a UDP echo backend.

`config` prints what the operator rendered (summary, JSON, YAML), `status` finds the stunnerd
and names the Gateway without one, `icetest` relays probes through the UDP listener and fails on
the TCP listener nobody serves; a CDS that is down, a wrong or missing token and an unknown
Gateway each end with one line and their own exit code.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.echo import udp_echo
from support.ports import free_port
from support.security_stack import Stack, running_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BIN = Path(sys.executable).parent


async def stunnerctl(
    stack: Stack, *args: str, token: str | None = "stack", cds: str | None = None
) -> tuple[int, str, str]:
    env = {"PATH": "/usr/bin:/bin"}
    if token == "stack":
        token = stack.cds_token
    if token is not None:
        env["CDS_TOKEN"] = token
    argv = [str(BIN / "stunnerctl"), "--cds", cds or f"127.0.0.1:{stack.cds_ports[0]}", *args]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(tmp_path, debug=False) as s:
        yield s


async def test_config_prints_every_gateway_in_upstreams_summary_shape(stack: Stack) -> None:
    rc, out, err = await stunnerctl(stack, "config")
    assert rc == 0, err
    password = stack.secrets.password
    assert out.splitlines() == [
        'Gateway: stunner/tcp-gateway (loglevel: "all:DEBUG")',
        f"Authentication type: static, username/password: user-1/{password}",
        "Listeners:",
        "  - Name: stunner/tcp-gateway/tcp-listener",
        "    Protocol: TURN-TCP",
        f"    Public address:port: 127.0.0.1:{stack.tcp_port}",
        "    Routes: [stunner/echo]",
        "    Endpoints: [127.0.0.1]",
        'Gateway: stunner/udp-gateway (loglevel: "all:DEBUG")',
        f"Authentication type: static, username/password: user-1/{password}",
        "Listeners:",
        "  - Name: stunner/udp-gateway/udp-listener",
        "    Protocol: TURN-UDP",
        f"    Public address:port: 127.0.0.1:{stack.udp_port}",
        "    Routes: [stunner/echo]",
        "    Endpoints: [127.0.0.1]",
    ]
    # One Gateway by NAME with -n, or by NAMESPACE/NAME.
    rc, one, err = await stunnerctl(stack, "-n", "stunner", "config", "udp-gateway")
    assert rc == 0, err
    assert one.splitlines() == out.splitlines()[8:]
    rc, same, _ = await stunnerctl(stack, "config", "stunner/udp-gateway")
    assert same == one


async def test_config_json_and_yaml_are_the_configs_the_cds_serves(stack: Stack) -> None:
    reply = await stack.http.get(
        f"http://127.0.0.1:{stack.cds_ports[0]}/api/v1/configs/stunner/udp-gateway",
        headers={"Authorization": f"Bearer {stack.cds_token}"},
    )
    served = reply.json()
    rc, out, err = await stunnerctl(stack, "config", "stunner/udp-gateway", "-o", "json")
    assert rc == 0, err
    assert len(out.splitlines()) == 1
    printed = json.loads(out)
    assert printed["admin"]["name"] == "stunner/udp-gateway"
    assert printed["listeners"] == served["listeners"]
    assert printed["auth"] == served["auth"]
    rc, out, err = await stunnerctl(stack, "config", "-o", "yaml")
    assert rc == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["admin"]["name"] for d in docs] == ["stunner/tcp-gateway", "stunner/udp-gateway"]
    assert docs[1] == printed


async def test_status_finds_the_stunnerd_and_names_the_gateway_without_one(stack: Stack) -> None:
    health = str(stack.health_port)
    rc, out, err = await stunnerctl(stack, "status", "--health-port", health)
    assert rc == 1
    lines = out.splitlines()
    assert lines[0].startswith("Gateway: stunner/tcp-gateway unreachable: no stunnerd answered")
    assert f"http://127.0.0.1:{stack.health_port + 1}/status" in lines[0]
    assert lines[1] == (
        "Gateway: stunner/udp-gateway status: READY, allocations: 0 "
        f"(http://127.0.0.1:{stack.health_port}/status)"
    )
    assert lines[2] == (
        f"  - stunner/udp-gateway/udp-listener: TURN-UDP 127.0.0.1:{stack.udp_port}, allocations: 0"
    )
    assert err.strip() == (
        "stunnerctl: no stunnerd answered for stunner/tcp-gateway "
        "(give its health URL with --status-url)"
    )
    # One Gateway, found the same way; and the raw /status as JSON.
    rc, out, err = await stunnerctl(
        stack, "status", "stunner/udp-gateway", "--health-port", health, "-o", "json"
    )
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["admin"]["name"] == "stunner/udp-gateway"
    assert doc["status"] == "READY"
    assert stack.secrets.password not in out  # /status carries no secrets
    # An explicit health URL replaces the discovery.
    url = f"http://127.0.0.1:{stack.health_port}"
    rc, out, err = await stunnerctl(
        stack, "status", "udp-gateway", "-n", "stunner", "--status-url", url
    )
    assert rc == 0, err
    assert out.startswith("Gateway: stunner/udp-gateway status: READY")
    closed = free_port()
    rc, out, err = await stunnerctl(
        stack, "status", "stunner/udp-gateway", "--status-url", f"127.0.0.1:{closed}"
    )
    assert rc == 1
    assert out.startswith(
        f"Gateway: stunner/udp-gateway unreachable: no stunnerd answered "
        f"(http://127.0.0.1:{closed}/status): "
    )
    assert "stunner/udp-gateway" in err


async def test_icetest_measures_each_listener_and_fails_the_unserved_one(stack: Stack) -> None:
    async with udp_echo() as echo:
        peer = echo.url
        rc, out, err = await stunnerctl(
            stack, "icetest", "stunner/udp-gateway", "--peer", peer, "-c", "30", "-o", "json"
        )
        assert rc == 0, err
        result: dict[str, Any] = json.loads(out)
        assert result["listener"] == "stunner/udp-gateway/udp-listener"
        assert result["server"] == f"udp://127.0.0.1:{stack.udp_port}"
        assert (result["sent"], result["received"], result["loss"]) == (30, 30, 0.0)
        assert 0 < result["rtt_p50_ms"] <= result["rtt_p99_ms"]
        assert result["ok"] is True
        assert result["error"] is None

        env_timeout = ["--wait-ms", "300"]
        rc, out, err = await stunnerctl(stack, "icetest", "--peer", peer, "-c", "5", *env_timeout)
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == "Gateway: stunner/tcp-gateway"
    assert lines[1].startswith(
        f"  - stunner/tcp-gateway/tcp-listener: TURN-TCP tcp://127.0.0.1:{stack.tcp_port}: FAIL: "
    )
    assert "cannot connect to TURN server" in lines[1]
    assert lines[2] == "Gateway: stunner/udp-gateway"
    assert lines[3].startswith(
        f"  - stunner/udp-gateway/udp-listener: TURN-UDP udp://127.0.0.1:{stack.udp_port}: "
        "sent 5, received 5, loss 0.0%, rtt p50 "
    )
    assert lines[3].endswith(": OK")
    assert err.strip() == "stunnerctl: icetest failed on 1 of 2 listener(s)"

    # A peer that no route admits: the allocation works, the permission is refused.
    rc, out, err = await stunnerctl(
        stack, "icetest", "stunner/udp-gateway", "--peer", "udp://127.0.0.2:9", "-c", "2"
    )
    assert rc == 1
    assert "FAIL: peer 127.0.0.2:9 is not allowed by the TURN server" in out
    assert "403" in out
    assert err.strip() == "stunnerctl: icetest failed on 1 of 1 listener(s)"


async def test_icetest_mints_credentials_from_the_shared_secret_of_ephemeral_auth(
    stack: Stack,
) -> None:
    config = stack.manifests / "gatewayconfig.yaml"
    text = config.read_text()
    secret = "icetest-shared-secret"
    config.write_text(
        text.replace("authType: static", "authType: ephemeral").replace(
            f"password: {stack.secrets.password}", f"sharedSecret: {secret}"
        )
    )
    await stack.wait_status(
        lambda s: s.get("auth", {}).get("type") == "ephemeral", "stunnerd on ephemeral auth"
    )
    rc, out, err = await stunnerctl(stack, "config", "stunner/udp-gateway")
    assert rc == 0, err
    assert f"Authentication type: ephemeral, shared-secret: {secret}" in out.splitlines()
    async with udp_echo() as echo:
        rc, out, err = await stunnerctl(
            stack, "icetest", "stunner/udp-gateway", "--peer", echo.url, "-c", "5"
        )
    assert rc == 0, out + err
    assert "sent 5, received 5, loss 0.0%" in out


async def test_cds_errors_end_with_one_line_and_their_exit_code(stack: Stack) -> None:
    rc, out, err = await stunnerctl(stack, "config", token="wrong-token")
    assert (rc, out) == (3, "")
    assert err.strip() == (
        f"stunnerctl: the CDS at http://127.0.0.1:{stack.cds_ports[0]} refused the request (401): "
        "the bearer token is wrong; set CDS_TOKEN or --cds-token-file"
    )
    assert "wrong-token" not in err
    rc, _, err = await stunnerctl(stack, "status", token=None)
    assert rc == 3
    assert "the bearer token is missing" in err
    token_file = stack.tmp / "ctl-token"
    token_file.write_text(f"{stack.cds_token}\n")
    rc, out, err = await stunnerctl(
        stack, "config", "stunner/udp-gateway", "--cds-token-file", str(token_file), token=None
    )
    assert rc == 0, err
    rc, _, err = await stunnerctl(stack, "config", "stunner/no-such-gateway")
    assert rc == 2
    assert err.strip().endswith(
        "has no config for gateway stunner/no-such-gateway; "
        "the Gateways it serves: stunner/tcp-gateway, stunner/udp-gateway"
    )
    # Namespace `default` when the Gateway lives elsewhere: the hint names where.
    rc, _, err = await stunnerctl(stack, "config", "udp-gateway")
    assert rc == 2
    assert err.strip().endswith(
        "has no config for gateway default/udp-gateway; "
        "it serves stunner/udp-gateway: try stunner/udp-gateway or -n stunner"
    ), err
    assert len(err.strip().splitlines()) == 1
    rc, _, err = await stunnerctl(stack, "-n", "default", "config")
    assert "its Gateways are in namespace(s) stunner" in err
    # A token file that is not there is an error, not a warning and exit 0.
    rc, out, err = await stunnerctl(
        stack, "config", "--cds-token-file", str(stack.tmp / "nonexistent"), token=None
    )
    assert (rc, out) == (2, "")
    assert err.strip() == (
        f"stunnerctl: CDS token file {str(stack.tmp / 'nonexistent')!r}: No such file or directory"
    )
    # --cds pointed at something that is not a CDS (a stunnerd health port) says so.
    rc, out, err = await stunnerctl(stack, "config", cds=f"127.0.0.1:{stack.health_port}")
    assert rc == 2, err
    assert "does not answer like a config discovery service" in err, err
    assert len(err.strip().splitlines()) == 1
    rc, _, err = await stunnerctl(stack, "config", "a/b/c")
    assert rc == 2
    assert "expected NAME or NAMESPACE/NAME" in err
    closed = free_port()
    rc, out, err = await stunnerctl(stack, "icetest", cds=f"127.0.0.1:{closed}")
    assert (rc, out) == (5, "")
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"stunnerctl: cannot reach the CDS at http://127.0.0.1:{closed}")
