"""From a laptop with a kubeconfig: turncat and stunnerctl find the CDS through the API server.

The user's processes get a kubeconfig and nothing else (no CDS address, no token): they list the
pods labelled ``stunner.l7mp.io/config-discovery-service=enabled``, read the CDS token from the
chart's Secret and reach the CDS pod through a port-forward over the real API server
(``pods/portforward``, WebSocket). Behind the API server a kwok node (support.kwok_node) plays
the kubelet for the chart's CDS pod: its port-forward streams end at the CDS process. Restarting
kwok breaks every stream, as a kubelet or API server restart would.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from stunner_common.io.kube import CDS_LABEL, KubeOptions, open_cds_forward
from support.echo import udp_echo
from support.kube_stack import NAMESPACE, KubeStack, echo_gateway
from support.kubelet import PodRunner, pod_runner
from support.kwok_node import APISERVER_ARGS, Forward, KwokNode, kwok_node
from support.ports import LOOPBACK, free_port, free_udp_tcp_port
from support.processes import ServerProcess, command

# The first test also builds kwok when the machine has no copy yet (about 3 minutes cold).
pytestmark = pytest.mark.timeout(900)

GATEWAY = "udp-gateway"
LISTENER = "udp-listener"
CDS_POD_PORT = 13478
HEALTH_PORT = 8086
"""The health port of the configs the operator renders (admin.healthcheck_endpoint)."""


def _gateway_objects(port: int) -> list[dict[str, Any]]:
    return echo_gateway(GATEWAY, LISTENER, port)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    """The folder's stack, with an API server that dials kubelets at their InternalIP."""
    stack = KubeStack(tmp_path_factory.mktemp("kube"), apiserver_args=APISERVER_ARGS)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def kwok(stack: KubeStack) -> Iterator[KwokNode]:
    """kwok runs one of the chart's CDS pods; its port 13478 forwards to the CDS process."""
    client = stack.admin
    pods = client.wait_for(
        "the chart's CDS pods",
        lambda: client.list("v1", "Pod", NAMESPACE, label_selector=CDS_LABEL),
        timeout_s=60.0,
    )
    pod = sorted(p["metadata"]["name"] for p in pods)[0]
    cluster = stack.cluster
    assert cluster.pki is not None
    with kwok_node(
        client,
        stack.workdir / "kwok",
        server=cluster.server,
        ca_cert=cluster.pki.ca_cert,
        admin_cert=(cluster.pki.admin_cert, cluster.pki.admin_key),
    ) as node:
        node.start([Forward(NAMESPACE, pod, CDS_POD_PORT, stack.cds_port)])
        node.bind(NAMESPACE, pod)
        yield node


@pytest.fixture(scope="module")
def gateway(stack: KubeStack, kwok: KwokNode) -> Iterator[PodRunner]:
    """udp-gateway with its stunnerd running and its LB address in the CDS."""
    client = stack.admin
    client.apply_all(_gateway_objects(free_udp_tcp_port()))
    # The stunnerd pods' node has kwok's server as its kubelet API: their port-forwards end
    # where kwok's PortForward resources say (test_stunnerctl_status... adds one).
    with pod_runner(client, stack.workdir, kubelet_port=kwok.port) as runner:
        running = client.wait_for(
            "the stunnerd pod running",
            lambda: runner.pod_for_gateway(NAMESPACE, GATEWAY),
            timeout_s=60.0,
        )
        client.wait_for(
            "the Gateway's Service", lambda: client.get("v1", "Service", GATEWAY, NAMESPACE)
        )
        client.patch_status(
            "v1",
            "Service",
            GATEWAY,
            NAMESPACE,
            {"loadBalancer": {"ingress": [{"ip": running.ip}]}},
        )

        def advertised() -> bool:
            config = stack.cds_configs().get(f"{NAMESPACE}/{GATEWAY}")
            listeners = (config or {}).get("listeners") or [{}]
            return bool(listeners[0].get("public_address") == running.ip)

        client.wait_for("the LB address in the config", advertised)

        def routed() -> bool:
            # The pod's stunnerd has taken the config with the route (peers are admitted).
            url = f"http://{running.ip}:{running.health_port}/status"
            try:
                status = httpx.get(url, timeout=2.0).json()
            except (httpx.HTTPError, ValueError):
                return False
            listeners = status.get("listeners") or [{}]
            return bool(listeners[0].get("routes"))

        client.wait_for("the stunnerd pod serving the route", routed)
        yield runner


def laptop_env(stack: KubeStack, home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    """The environment of a user with a kubeconfig: no CDS address, no CDS token."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CDS_", "STUNNER_CDS", "AUTH_CDS")) and k != "KUBECONFIG"
    }
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    env["KUBECONFIG"] = str(kubeconfig or stack.cluster.admin_kubeconfig)
    return env


async def run_tool(
    argv: list[str], env: dict[str, str], timeout_s: float = 60.0
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def assert_one_line_failure(rc: int, err: str, text: str) -> None:
    """Exit status not 0 and one line on stderr (no traceback) that says ``text``."""
    assert rc != 0, err
    assert len(err.strip().splitlines()) == 1, err
    assert text in err, err


def portforwards(stack: KubeStack) -> int:
    """How many port-forward requests the API server has audited (each opens one stream)."""
    return sum(
        1
        for event in stack.cluster.audit_events()
        if (event.get("objectRef") or {}).get("subresource") == "portforward"
        and event.get("stage") == "ResponseStarted"
    )


def stunnerctl(*args: str) -> list[str]:
    return [*command("stunnerctl", "turncat.ctl.main"), *args]


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    async with udp_echo() as server:
        yield server.addr


async def _line(proc: asyncio.subprocess.Process, payload: bytes, timeout_s: float) -> bytes:
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(payload)
    await proc.stdin.drain()
    async with asyncio.timeout(timeout_s):
        return await proc.stdout.readline()


async def test_turncat_with_only_a_kubeconfig_relays_and_outlives_a_forward_drop(
    stack: KubeStack, kwok: KwokNode, gateway: PodRunner, echo: tuple[str, int], tmp_path: Path
) -> None:
    env = laptop_env(stack, tmp_path / "home")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turncat",
        "-l",
        "all:INFO",
        "-",
        f"k8s://{NAMESPACE}/{GATEWAY}:{LISTENER}",
        f"udp://{echo[0]}:{echo[1]}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )

    async def stderr() -> str:
        assert proc.stderr is not None
        if proc.returncode is None:
            proc.kill()
        async with asyncio.timeout(10):
            return (await proc.stderr.read()).decode(errors="replace")

    try:
        reply = await _line(proc, b"hello from the laptop\n", 30.0)
        assert reply == b"hello from the laptop\n", await stderr()
        kwok.restart()  # every port-forward stream through the kubelet breaks
        reply = await _line(proc, b"still here after the drop\n", 15.0)
        assert reply == b"still here after the drop\n", await stderr()
        assert proc.stdin is not None
        proc.stdin.close()
        async with asyncio.timeout(15):
            rc = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    assert rc == 0, err
    assert "through the kubeconfig" in err


async def test_stunnerctl_config_and_status_with_only_a_kubeconfig(
    stack: KubeStack, kwok: KwokNode, gateway: PodRunner, tmp_path: Path
) -> None:
    env = laptop_env(stack, tmp_path / "home")
    rc, out, err = await run_tool(stunnerctl("config", f"{NAMESPACE}/{GATEWAY}"), env)
    assert rc == 0, err
    assert f"{NAMESPACE}/{GATEWAY}" in out
    assert LISTENER in out
    # status: each stunnerd pod of the Gateway through a port-forward to its health port (8086
    # in the config), which kwok sends to where the pod's stunnerd really listens.
    pod = gateway.pod_for_gateway(NAMESPACE, GATEWAY)
    assert pod is not None
    kwok.forwards.append(Forward(NAMESPACE, pod.name, HEALTH_PORT, pod.health_port, address=pod.ip))
    await asyncio.to_thread(kwok.restart)
    before = portforwards(stack)
    rc, out, err = await run_tool(stunnerctl("status", f"{NAMESPACE}/{GATEWAY}"), env)
    assert rc == 0, out + err
    assert f"Gateway: {NAMESPACE}/{GATEWAY} status: READY" in out, out
    assert f"(pod {NAMESPACE}/{pod.name}:{HEALTH_PORT})" in out, out
    assert LISTENER in out
    assert portforwards(stack) >= before + 2  # the CDS's and the stunnerd pod's
    rc, out, err = await run_tool(stunnerctl("status", f"{NAMESPACE}/{GATEWAY}", "-o", "json"), env)
    assert rc == 0, out + err
    assert json.loads(out)["admin"]["name"] == f"{NAMESPACE}/{GATEWAY}"
    # A pod port nothing listens on: one line that names the pod, exit status 1.
    rc, out, err = await run_tool(
        stunnerctl("status", f"{NAMESPACE}/{GATEWAY}", "--pod-port", "8999"), env
    )
    assert rc == 1, out + err
    assert f"pod {NAMESPACE}/{pod.name}:8999" in out, out
    assert "Traceback" not in err, err


async def test_the_forward_reopens_after_a_drop_and_says_what_it_costs(
    stack: KubeStack, kwok: KwokNode, tmp_path: Path
) -> None:
    env = laptop_env(stack, tmp_path / "home")
    started = time.monotonic()
    async with open_cds_forward(KubeOptions(), env) as forward:
        assert forward.token == stack.cds_token  # read from the chart's Secret
        headers = {"Authorization": f"Bearer {forward.token}"}
        async with httpx.AsyncClient(base_url=f"http://{forward.address}", timeout=10) as http:
            first = await http.get("/api/v1/configs", headers=headers)
            first_s = time.monotonic() - started
            assert first.status_code == 200, first.text
            await asyncio.to_thread(kwok.restart)
            again = await http.get("/api/v1/configs", headers=headers)
            assert again.status_code == 200, again.text
        assert forward.websockets_opened >= 2
    print(
        f"\nport-forward start-up: {forward.started_s * 1000:.0f} ms to listen "
        f"(kubeconfig, pod list, Secret), {first_s * 1000:.0f} ms to the first CDS answer"
    )
    with socket.socket() as sock:  # closed with the context
        assert sock.connect_ex((LOOPBACK, forward.port)) != 0


async def test_clear_errors_without_a_usable_cds(
    stack: KubeStack, kwok: KwokNode, tmp_path: Path
) -> None:
    client = stack.admin
    home = tmp_path / "home"
    # No kubeconfig at all.
    env = laptop_env(stack, home, tmp_path / "missing.kubeconfig")
    rc, _out, err = await run_tool(stunnerctl("config"), env)
    assert_one_line_failure(rc, err, "no kubeconfig")

    # No CDS pod in the namespace asked for.
    env = laptop_env(stack, home)
    rc, _out, err = await run_tool(stunnerctl("--cds-server-namespace", "default", "config"), env)
    assert_one_line_failure(rc, err, "no CDS pod")

    # Several, none ready (never scheduled).
    ns = "cds-pending"
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for i in range(2):
        client.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"cds-{i}",
                    "namespace": ns,
                    "labels": {"stunner.l7mp.io/config-discovery-service": "enabled"},
                },
                "spec": {"containers": [{"name": "cds", "image": "localhost/stunner-cds"}]},
            }
        )
    rc, _out, err = await run_tool(stunnerctl("--cds-server-namespace", ns, "config"), env)
    assert_one_line_failure(rc, err, "none is ready")

    # A user who may not list pods.
    client.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "laptop-nobody", "namespace": NAMESPACE},
        }
    )
    nobody = stack.cluster.service_account_kubeconfig(
        NAMESPACE, "laptop-nobody", tmp_path / "nobody.kubeconfig"
    )
    env = laptop_env(stack, home, nobody)
    rc, _out, err = await run_tool(
        [
            sys.executable,
            "-m",
            "turncat",
            "-",
            f"k8s://{NAMESPACE}/{GATEWAY}:{LISTENER}",
            "udp://127.0.0.1:9",
        ],
        env,
    )
    assert_one_line_failure(rc, err, "forbidden")


async def test_stunnerd_dry_run_with_c_k8s_loads_its_config_through_the_forward(
    stack: KubeStack, kwok: KwokNode, gateway: PodRunner, tmp_path: Path
) -> None:
    env = laptop_env(stack, tmp_path / "home")
    argv = [*command("stunnerd", "stunnerd"), "-c", "k8s", "--id", f"{NAMESPACE}/{GATEWAY}"]
    rc, out, err = await run_tool([*argv, "--dry-run"], env)
    assert rc == 0, out + err
    assert f"config {NAMESPACE}/{GATEWAY} is valid" in out, out + err


async def test_stunnerd_c_k8s_watch_follows_the_cds_across_a_forward_drop(
    stack: KubeStack, kwok: KwokNode, gateway: PodRunner, tmp_path: Path
) -> None:
    client = stack.admin
    health = free_port()
    env = {
        **laptop_env(stack, tmp_path / "home"),
        "STUNNERD_HEALTH_PORT": str(health),
    }
    argv = [
        *command("stunnerd", "stunnerd"),
        "-c",
        "k8s",
        "-w",
        "--id",
        f"{NAMESPACE}/{GATEWAY}",
        "--bind",
        "127.0.0.77",
    ]
    proc = ServerProcess(argv, env=env, log_path=tmp_path / "stunnerd.log")

    async def realm_is(realm: str) -> None:
        deadline = time.monotonic() + 30.0
        last: Any = None
        async with httpx.AsyncClient(timeout=2.0) as http:
            while time.monotonic() < deadline:
                assert proc.alive(), proc.output()[-3000:]
                try:
                    last = (await http.get(f"http://127.0.0.77:{health}/status")).json()
                except (httpx.HTTPError, ValueError):
                    last = None
                if (last or {}).get("auth", {}).get("realm") == realm:
                    return
                await asyncio.sleep(0.1)
        raise AssertionError(f"stunnerd never had realm {realm}: {last}\n{proc.output()[-3000:]}")

    def set_realm(realm: str) -> None:
        client.request(
            "PATCH",
            f"/apis/stunner.l7mp.io/v1/namespaces/{NAMESPACE}/gatewayconfigs/stunner-gatewayconfig",
            body={"spec": {"realm": realm}},
            content_type="application/merge-patch+json",
        )

    try:
        await realm_is("stunner.l7mp.io")
        before = portforwards(stack)
        await asyncio.to_thread(kwok.restart)  # the watch's WebSocket through the API server breaks
        set_realm("after-the-drop.example.com")
        await realm_is("after-the-drop.example.com")
        assert portforwards(stack) > before  # the watcher came back through a new port-forward
    finally:
        set_realm("stunner.l7mp.io")
        proc.stop()


async def test_a_kubeconfig_with_an_exec_credential_plugin_finds_the_cds(
    stack: KubeStack, kwok: KwokNode, gateway: PodRunner, tmp_path: Path
) -> None:
    """As with a cloud provider's kubeconfig: the credentials come from a client-go exec
    plugin (here one that prints the cluster admin's client certificate)."""
    pki = stack.cluster.pki
    assert pki is not None
    plugin = tmp_path / "credential-plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {
            "clientCertificateData": pki.admin_cert.read_text(),
            "clientKeyData": pki.admin_key.read_text(),
        },
    }
    plugin.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        f"print({json.dumps(json.dumps(credential))})\n"
    )
    plugin.chmod(0o755)
    doc = yaml.safe_load(stack.cluster.admin_kubeconfig.read_text())
    for user in doc["users"]:
        user["user"] = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": str(plugin),
                "interactiveMode": "Never",
            }
        }
    kubeconfig = tmp_path / "exec.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(doc))
    env = laptop_env(stack, tmp_path / "home", kubeconfig)
    rc, out, err = await run_tool(stunnerctl("config", f"{NAMESPACE}/{GATEWAY}"), env)
    assert rc == 0, out + err
    assert LISTENER in out
