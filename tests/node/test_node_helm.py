"""`helm install` of charts/stunner on the real node, then upstream's udp-echo walkthrough.

The real helm CLI installs the chart with its default values (the Redis image aside, see
support.node_helm): the operator, two CDS replicas, Redis and the auth service run as pods from
our images, the operator with its in-cluster configuration and elected through its Lease, and
`helm test` passes. Then the walkthrough of upstream's operator README (its YAML, as far as this
cluster serves its API versions): the operator renders the Gateway's stunnerd Deployment, whose
pod reads its config from the CDS by its Service name through cluster DNS, and turncat on the
host relays through the Gateway Service's NodePort to the echo pod until the UDPRoute goes.
Then faults with a call running: the Redis pod, each CDS pod and the operator pod deleted in
turn, an edit made while each is away, the datagrams the call lost counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import yaml
from interop.browser.test_media_echo_chromium import FAKE_MEDIA, FRAMES, page_state_when
from interop.stunnerd.test_stunnerd_chromium import chromium

from support.devtools import devtools_page
from support.kube import KubeError
from support.kube_stack import NAMESPACE
from support.media_echo import media_echo
from support.node_call import CallReport, EchoCall, wait_turn_answers
from support.node_helm import (
    CHART_COMPONENTS,
    NodeRelease,
    component_pods,
    installed_release,
    pod_ready,
    pod_summary,
    software_missing,
    udp_echo,
)
from support.node_images import UDP_ECHO_PORT
from support.node_stack import NODE_IP, NodeStack
from support.ports import free_port
from support.processes import which
from support.turncat_harness import turncat

pytestmark = pytest.mark.timeout(600)

GATEWAY = "udp-gateway"
LISTENER = "udp-listener"

# The walkthrough's own manifests (upstream's operator README, "Configure the operator").
WALKTHROUGH = """\
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: GatewayClass
metadata:
  name: stunner-gatewayclass
spec:
  controllerName: "stunner.l7mp.io/gateway-operator"
  parametersRef:
    group: "stunner.l7mp.io"
    kind: GatewayConfig
    name: stunner-gatewayconfig
    namespace: stunner
  description: "STUNner is a WebRTC ingress gateway for Kubernetes"
---
apiVersion: stunner.l7mp.io/v1alpha1
kind: GatewayConfig
metadata:
  name: stunner-gatewayconfig
  namespace: stunner
spec:
  stunnerConfig: "stunnerd-configmap"
  realm: stunner.l7mp.io
  authType: plaintext
  userName: "user-1"
  password: "pass-1"
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: Gateway
metadata:
  name: udp-gateway
  namespace: stunner
spec:
  gatewayClassName: stunner-gatewayclass
  listeners:
    - name: udp-listener
      port: 3478
      protocol: UDP
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: UDPRoute
metadata:
  name: udp-echo
  namespace: stunner
spec:
  parentRefs:
    - name: udp-gateway
  rules:
    - backendRefs:
        - name: udp-echo
"""
SERVED_INSTEAD = {"gateway.networking.k8s.io/v1alpha2": "gateway.networking.k8s.io/v1"}


@pytest.fixture(scope="module")
def release(node: NodeStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeRelease]:
    gateway_class = ("gateway.networking.k8s.io/v1", "GatewayClass", "stunner-gatewayclass")
    with installed_release(node, tmp_path_factory.mktemp("helm"), gateway_class) as rel:
        print(f"\nnode release timings: {rel.timings}")
        yield rel


def test_helm_install_runs_every_component_as_a_ready_pod(release: NodeRelease) -> None:
    for component, replicas in CHART_COMPONENTS.items():
        pods = component_pods(release.admin, component)
        assert len(pods) == replicas, component
        assert all(pod_ready(p) for p in pods), component
        for pod in pods:
            image = pod["spec"]["containers"][0]["image"]
            assert image.startswith("localhost/stunner-"), (component, image)
            assert pod["spec"]["nodeName"] == "stunner-node"


def test_the_operator_leads_through_its_lease_with_the_in_cluster_configuration(
    release: NodeRelease,
) -> None:
    [pod] = component_pods(release.admin, "operator")
    name = pod["metadata"]["name"]
    holder = release.admin.wait_for("the Lease held", release.lease_holder, timeout_s=60)
    assert holder.partition("_")[0] == name  # client-go's identity: the pod name, "_", a UUID
    container = pod["spec"]["containers"][0]
    assert "KUBECONFIG" not in {e["name"] for e in container.get("env") or []}
    assert not any("kubeconfig" in a for a in container.get("args") or [])
    mounts = {m["mountPath"] for m in container.get("volumeMounts") or []}
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts


def test_helm_test_passes(release: NodeRelease) -> None:
    output = release.helm.run("test", "stunner", "--namespace", NAMESPACE, "--logs")
    assert "stunner-test-cds" in output, output
    assert "Succeeded" in output, output


# -- the walkthrough


def walkthrough_objects(admin: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The walkthrough's manifests, each in its own apiVersion where the cluster serves it,
    else in the one served instead, and with a port on each Service backendRef (Gateway API
    v1.6's CRDs refuse a Service reference without one: "Must have port for Service
    reference"; the walkthrough's caveats say the operator ignores it). Returns them and what
    had to change."""
    objects, changed = [], []
    for doc in yaml.safe_load_all(WALKTHROUGH):
        try:
            admin.resource(doc["apiVersion"], doc["kind"])
        except KubeError as err:
            served = SERVED_INSTEAD[doc["apiVersion"]]
            changed.append(f"{doc['kind']} {doc['apiVersion']} not served ({err}): {served}")
            doc = {**doc, "apiVersion": served}
        if doc["kind"] == "UDPRoute":
            doc = route_with(["udp-echo"], doc["apiVersion"])
            changed.append(f"UDPRoute backendRefs given port {UDP_ECHO_PORT}")
        objects.append(doc)
    return objects, changed


def gateway_pods(admin: Any, gateway: str = GATEWAY) -> list[dict[str, Any]]:
    pods = admin.list(
        "v1",
        "Pod",
        NAMESPACE,
        label_selector=f"stunner.l7mp.io/related-gateway-name={gateway}",
    )
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture(scope="module")
def walkthrough(release: NodeRelease) -> dict[str, Any]:
    """Steps "Create a UDP echo service" and "Configure the operator"; returns the addresses
    of "Send a request via STUNner" (the Gateway Service's NodePort on the node IP: no load
    balancer here) and what differed from the text."""
    admin = release.admin
    admin.apply_all(udp_echo())
    objects, changed = walkthrough_objects(admin)
    admin.apply_all(objects)
    started = time.monotonic()
    try:
        admin.wait_for(
            f"a Ready stunnerd pod of {GATEWAY}",
            lambda: [p for p in gateway_pods(admin) if pod_ready(p)],
            timeout_s=120,
        )
        admin.wait_for(
            "the udp-echo pod Ready",
            lambda: [
                p
                for p in admin.list("v1", "Pod", NAMESPACE, label_selector="app=udp-echo")
                if pod_ready(p)
            ],
            timeout_s=60,
        )
    except TimeoutError as err:
        [operator] = component_pods(admin, "operator")
        log = release.pod_log(operator["metadata"]["name"])[-3000:]
        pytest.fail(f"{err}\n{pod_summary(admin)}\noperator log:\n{log}")
    release.timings["gateway-pod-ready"] = round(time.monotonic() - started, 1)
    service = admin.get("v1", "Service", GATEWAY, NAMESPACE)
    assert service is not None, "the operator made no Service for the Gateway"
    port = next(p for p in service["spec"]["ports"] if p["protocol"] == "UDP")
    echo = admin.get("v1", "Service", "udp-echo", NAMESPACE)
    assert echo is not None
    return {
        "server": f"turn://user-1:pass-1@{NODE_IP}:{port['nodePort']}",
        "peer": f"udp://{echo['spec']['clusterIP']}:{UDP_ECHO_PORT}",
        "changed": changed,
        "service": service,
    }


@contextlib.asynccontextmanager
async def call_through(walk: dict[str, Any]) -> AsyncIterator[EchoCall]:
    """turncat on the host (udp://127.0.0.1:PORT → the Gateway → udp-echo) and a call on it."""
    await asyncio.to_thread(wait_turn_answers, walk["server"])
    local = free_port(socket.SOCK_DGRAM)
    async with turncat(f"udp://127.0.0.1:{local}", walk["server"], walk["peer"]) as tc:
        call = EchoCall(local)
        try:
            await call.start()
        except TimeoutError:
            pytest.fail(f"no echo through the Gateway:\n{tc.stderr}")
        try:
            yield call
        finally:
            await call.stop(drain_s=0.0)


def test_the_gateways_stunnerd_pod_reads_its_config_from_the_cds_service_by_name(
    release: NodeRelease, walkthrough: dict[str, Any]
) -> None:
    [pod] = [p for p in gateway_pods(release.admin) if pod_ready(p)]
    container = pod["spec"]["containers"][0]
    assert container["image"].startswith("localhost/stunner-stunnerd:")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STUNNER_CONFIG_ORIGIN"] == "http://stunner-config-discovery.stunner.svc:13478"
    log = release.pod_log(pod["metadata"]["name"])
    assert "stunner-config-discovery" in log or "config" in log.lower(), log[-2000:]
    print(f"\nwalkthrough differences: {walkthrough['changed']}; timings {release.timings}")


async def test_turncat_relays_through_the_gateway_to_the_echo_pod_until_the_route_goes(
    release: NodeRelease, walkthrough: dict[str, Any]
) -> None:
    admin = release.admin
    async with call_through(walkthrough) as call:
        await asyncio.sleep(1.0)
        assert call.report().received > 0
        route = next(o for o in walkthrough_objects(admin)[0] if o["kind"] == "UDPRoute")
        admin.delete(route["apiVersion"], "UDPRoute", "udp-echo", NAMESPACE)
        deleted = call.mark()
        try:
            await _until_silent(call, timeout_s=15.0)
            stopped_after_s = max(call.arrivals.values()) - deleted[1]
        finally:
            admin.apply(route)
    print(f"\nthe last echo came {stopped_after_s:.2f} s after the UDPRoute was deleted")


async def _until_silent(call: EchoCall, timeout_s: float, quiet_s: float = 1.0) -> None:
    """Until no reply came for ``quiet_s`` (the relay stopped)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        last = max(call.arrivals.values(), default=0.0)
        if loop.time() - last >= quiet_s:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"still relaying {timeout_s} s after the UDPRoute was deleted")


# -- the local stack's browser page against the cluster

BROWSER_GATEWAY = "browser-gateway"
BROWSER_PORT = 3479
MEDIA_ROUTE = "media-echo"
AUTH_PORT = 8088
"""The auth pod's port (the chart's auth.port)."""


def browser_objects(api_version: str) -> list[dict[str, Any]]:
    """A Gateway whose public address is the node IP (spec.addresses: the operator puts it in
    the Service's externalIPs, so kube-proxy forwards it), a StaticService for the media echo
    server on the node IP (a host process, as a media server outside the cluster would be),
    and a UDPRoute from that Gateway to it."""
    return [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": BROWSER_GATEWAY, "namespace": NAMESPACE},
            "spec": {
                "gatewayClassName": "stunner-gatewayclass",
                "addresses": [{"type": "IPAddress", "value": NODE_IP}],
                "listeners": [{"name": "udp", "port": BROWSER_PORT, "protocol": "UDP"}],
            },
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "StaticService",
            "metadata": {"name": MEDIA_ROUTE, "namespace": NAMESPACE},
            "spec": {"prefixes": [f"{NODE_IP}/32"]},
        },
        {
            "apiVersion": api_version,
            "kind": "UDPRoute",
            "metadata": {"name": MEDIA_ROUTE, "namespace": NAMESPACE},
            "spec": {
                "parentRefs": [{"name": BROWSER_GATEWAY}],
                "rules": [
                    {
                        "backendRefs": [
                            {
                                "group": "stunner.l7mp.io",
                                "kind": "StaticService",
                                "name": MEDIA_ROUTE,
                            }
                        ]
                    }
                ],
            },
        },
    ]


def allow_origin(release: NodeRelease, origin: str) -> dict[str, Any]:
    """`helm upgrade --reuse-values --set auth.corsOrigins=ORIGIN`, as a user does to let a web
    page fetch /ice; the auth pod that serves it once it is Ready."""
    admin = release.admin
    [old] = component_pods(admin, "auth")
    release.upgrade(f"auth.corsOrigins={origin}")

    def serving() -> list[dict[str, Any]]:
        pods = component_pods(admin, "auth")
        return [
            p
            for p in pods
            if pod_ready(p)
            and p["metadata"]["name"] != old["metadata"]["name"]
            and len(pods) == CHART_COMPONENTS["auth"]
        ]

    [pod] = admin.wait_for("the reconfigured auth pod Ready", serving, timeout_s=120)
    assert isinstance(pod, dict)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
    assert origin in (env.get("AUTH_CORS_ORIGINS") or ""), env
    return pod


async def test_a_browser_calls_through_a_gateway_with_ice_from_the_auth_pod(
    release: NodeRelease, walkthrough: dict[str, Any], tmp_path: Path
) -> None:
    """The local stack's page (scripts/media_echo.html, served by its aiortc echo server on the
    host) in headless Chromium: its RTCConfiguration comes from the auth pod's /ice, relay only;
    the video goes through the Gateway's Service to its stunnerd pod and on to the echo server
    on the node IP, and stops when the UDPRoute goes.

    The walkthrough's Gateway has no address a client can use here: its Service's load
    balancer stays pending and the node has only an InternalIP (upstream's operator, like ours,
    takes a node address only from ExternalIP/ExternalDNS), so /ice answers 404 for it."""
    binary = which("chromium", "/usr/lib/chromium") or which("chromium-browser")
    if binary is None:
        software_missing("chromium is not installed")
        return
    admin = release.admin
    route_version = next(
        o["apiVersion"] for o in walkthrough_objects(admin)[0] if o["kind"] == "UDPRoute"
    )
    turn_uri = f"turn:{NODE_IP}:{BROWSER_PORT}?transport=udp"
    objects = browser_objects(route_version)
    admin.apply_all(objects)
    try:
        await asyncio.to_thread(
            admin.wait_for,
            f"a Ready stunnerd pod of {BROWSER_GATEWAY}",
            lambda: [p for p in gateway_pods(admin, BROWSER_GATEWAY) if pod_ready(p)],
            timeout_s=120,
        )
        log = tmp_path / "media-echo.log"
        async with media_echo(log, "(in the page URL)", "--ice-address", NODE_IP) as page:
            auth = await asyncio.to_thread(allow_origin, release, page)
            auth_url = f"http://{auth['status']['podIP']}:{AUTH_PORT}"
            query = {"service": "turn", "namespace": NAMESPACE, "gateway": BROWSER_GATEWAY}
            ice = f"{auth_url}/ice?{urlencode({**query, 'iceTransportPolicy': 'relay'})}"
            url = f"{page}/?{urlencode({'ice': ice})}"
            async with (
                chromium(binary, url, tmp_path / "camera", *FAKE_MEDIA) as browser_ws,
                devtools_page(browser_ws) as evaluate,
            ):
                state = await page_state_when(
                    evaluate, f"s.received.frames >= {FRAMES}", "frames to come back"
                )
                assert state["iceServers"] == [turn_uri], state
                pair = state["pair"]
                assert pair["local"]["type"] == "relay", state
                assert pair["local"]["url"] == turn_uri, state
                assert pair["remote"]["address"] == NODE_IP, state
                assert state["received"]["width"] > 0, state
                stats = await asyncio.to_thread(_get, f"{page}/stats")
                echoed = json.loads(stats[1])
                assert echoed["frames_echoed"] >= FRAMES, echoed

                admin.delete(route_version, "UDPRoute", MEDIA_ROUTE, NAMESPACE)
                deleted = time.monotonic()
                await page_state_when(
                    evaluate,
                    "['disconnected', 'failed'].includes(s.iceConnectionState)",
                    "the browser to lose its ICE connection",
                )
            pending = await asyncio.to_thread(
                _get, f"{auth_url}/ice?{urlencode({'service': 'turn', 'gateway': GATEWAY})}"
            )
            assert pending[0] == 404, pending
            assert "client-reachable address" in pending[1], pending
        print(
            f"\nbrowser call through {turn_uri}: {state['received']['frames']} frames back; "
            f"ICE down {time.monotonic() - deleted:.1f} s after the UDPRoute was deleted"
        )
    except BaseException:
        with contextlib.suppress(OSError):
            print((tmp_path / "media-echo.log").read_text(errors="replace")[-3000:])
        raise
    finally:
        for obj in reversed(objects):
            with contextlib.suppress(KubeError):
                admin.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], NAMESPACE)


def _get(url: str) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error status is an answer too."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


# -- faults with a call running

SECOND_PEER = "udp-echo-2"


def second_echo_service() -> dict[str, Any]:
    """A second Service on the echo pod: its ClusterIP is a peer only a route edit admits."""
    svc = udp_echo()[1]
    return {**svc, "metadata": {**svc["metadata"], "name": SECOND_PEER}}


def route_with(backends: list[str], api_version: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "UDPRoute",
        "metadata": {"name": "udp-echo", "namespace": NAMESPACE},
        "spec": {
            "parentRefs": [{"name": GATEWAY}],
            "rules": [{"backendRefs": [{"name": b, "port": UDP_ECHO_PORT} for b in backends]}],
        },
    }


async def _probe(walk: dict[str, Any], peer: str) -> bool:
    """Does a new turncat reach ``peer`` through the Gateway (one datagram echoed)?"""
    local = free_port(socket.SOCK_DGRAM)
    try:
        async with turncat(f"udp://127.0.0.1:{local}", walk["server"], peer):
            call = EchoCall(local, interval_s=0.05)
            try:
                await call.start(timeout_s=1.5)
            except TimeoutError:
                return False
            finally:
                await call.stop(drain_s=0.0)
            return True
    except AssertionError:  # turncat exited: the TURN server refused the peer
        return False


async def _wait_probe(walk: dict[str, Any], peer: str, want: bool, timeout_s: float) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    while await _probe(walk, peer) != want:
        if loop.time() - started > timeout_s:
            raise AssertionError(f"{peer} reachable={not want} {timeout_s} s on")
    return loop.time() - started


def _wait_replaced(release: NodeRelease, component: str, old: str, replicas: int) -> None:
    def back() -> bool:
        pods = component_pods(release.admin, component)
        return (
            len(pods) == replicas
            and old not in {p["metadata"]["name"] for p in pods}
            and all(pod_ready(p) for p in pods)
        )

    try:
        release.admin.wait_for(f"{component} back", back, timeout_s=120, interval_s=0.25)
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{pod_summary(release.admin)}") from None


async def test_a_call_survives_redis_cds_and_operator_pod_deletions_and_edits_take_effect(
    release: NodeRelease, walkthrough: dict[str, Any]
) -> None:
    admin = release.admin
    route_version = next(
        o["apiVersion"] for o in walkthrough_objects(admin)[0] if o["kind"] == "UDPRoute"
    )
    admin.apply(second_echo_service())
    second = admin.get("v1", "Service", SECOND_PEER, NAMESPACE)
    assert second is not None
    second_peer = f"udp://{second['spec']['clusterIP']}:{UDP_ECHO_PORT}"
    assert not await _probe(walkthrough, second_peer), "a peer no route admits was relayed to"
    victims = [("redis", p["metadata"]["name"]) for p in component_pods(admin, "redis")]
    victims += [("cds", p["metadata"]["name"]) for p in component_pods(admin, "cds")]
    victims += [("operator", p["metadata"]["name"]) for p in component_pods(admin, "operator")]
    figures: list[str] = []
    admitted = False
    async with call_through(walkthrough) as call:
        await asyncio.sleep(1.0)
        for component, pod in victims:
            mark = call.mark()
            admin.delete("v1", "Pod", pod, NAMESPACE)
            # The edit, made while the pod is away: admit the second peer, or take it back.
            admitted = not admitted
            backends = ["udp-echo", SECOND_PEER] if admitted else ["udp-echo"]
            admin.apply(route_with(backends, route_version))
            await asyncio.to_thread(
                _wait_replaced, release, component, pod, CHART_COMPONENTS[component]
            )
            back = asyncio.get_running_loop().time()
            in_force_s = await _wait_probe(walkthrough, second_peer, admitted, timeout_s=30.0)
            await asyncio.sleep(0.5)
            report: CallReport = await call.settled(mark)
            figures.append(
                f"{component} {pod}: back in {back - mark[1]:.1f} s, edit in force "
                f"{in_force_s:.1f} s after; call {report}"
            )
        total = await call.settled(call.whole())
    print("\n" + "\n".join([*figures, f"whole call: {total}"]))
    assert total.lost == 0, figures


# -- a rollout of the dataplane image

ROLLOUT_TAG_SUFFIX = "-rollout"
ROLLOUT_WATCH_S = 15.0


async def test_a_stunnerd_image_rollout_with_a_call_running(
    release: NodeRelease, walkthrough: dict[str, Any]
) -> None:
    """`helm upgrade --set dataplane.image.tag=` a new tag of the same image: the operator
    rolls the Gateway's Deployment (the chart's default strategy and 3600 s grace period).
    Measures what a call that started before the upgrade sees; it asserts only that the
    new pod comes up from the new tag and that a new call is relayed."""
    admin = release.admin
    [old] = [p for p in gateway_pods(admin) if pod_ready(p)]
    old_image = old["spec"]["containers"][0]["image"]
    new_tag = old_image.rpartition(":")[2] + ROLLOUT_TAG_SUFFIX
    new_image = old_image.rpartition(":")[0] + ":" + new_tag
    release.node.tag_image(old_image, new_image)

    def new_pod_ready() -> list[dict[str, Any]]:
        return [
            p
            for p in gateway_pods(admin)
            if p["spec"]["containers"][0]["image"] == new_image and pod_ready(p)
        ]

    async with call_through(walkthrough) as call:
        await asyncio.sleep(1.0)
        mark = call.mark()
        await asyncio.to_thread(release.upgrade, f"dataplane.image.tag={new_tag}")
        [new] = await asyncio.to_thread(
            admin.wait_for, "the new stunnerd pod Ready", new_pod_ready, timeout_s=120
        )
        ready_s = call.mark()[1] - mark[1]
        await asyncio.sleep(ROLLOUT_WATCH_S)
        report = await call.settled(mark)
        old_now = admin.get("v1", "Pod", old["metadata"]["name"], NAMESPACE)
    print(
        f"\nrollout: new pod Ready {ready_s:.1f} s after helm upgrade; the running call over "
        f"{ROLLOUT_WATCH_S + ready_s:.0f} s: {report}; the old pod "
        + (
            "gone"
            if old_now is None
            else f"terminating={bool(old_now['metadata'].get('deletionTimestamp'))}"
        )
    )
    assert new["spec"]["containers"][0]["image"] == new_image
    async with call_through(walkthrough) as fresh:
        await asyncio.sleep(0.5)
    assert fresh.report().received > 0
