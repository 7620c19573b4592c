"""A Gateway's whole life on a real cluster: Deployment and Service, pods, relaying, deletion.

The operator (as the chart's ServiceAccount) provisions a stunnerd Deployment and a
LoadBalancer Service for the Gateway; the ReplicaSet controller makes the pod, support.kubelet
runs the stunnerd its template describes; turncat finds the Gateway through the CDS
(``k8s://``) and relays to a UDP echo backend a StaticService admits. Deleting the UDPRoute
stops the relaying; deleting the Gateway removes its Deployment and Service through the real
garbage collector (ownerReferences) and its config from the CDS.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from support.cds import eventually
from support.echo import udp_echo
from support.kube import KubeError
from support.kube_stack import NAMESPACE, KubeStack, echo_gateway, echo_route
from support.kubelet import PodRunner, RunningPod, pod_runner
from support.ports import LOOPBACK, free_port, free_udp_tcp_port
from support.turncat_harness import turncat, udp_client

GATEWAY = "udp-gateway"
LISTENER = "udp-listener"
RELAY_WAIT_S = 30.0
"""How long a change of route may take to start or stop the relaying through a pod."""
LB_ANNOTATION = ("service.beta.kubernetes.io/aws-load-balancer-type", "nlb")


def _objects(port: int) -> list[dict[str, Any]]:
    return echo_gateway(
        GATEWAY,
        LISTENER,
        port,
        route=False,
        config_spec={"loadBalancerServiceAnnotations": {LB_ANNOTATION[0]: LB_ANNOTATION[1]}},
    )


def _route() -> dict[str, Any]:
    return echo_route(GATEWAY)


@pytest.fixture(scope="module")
def pods(stack: KubeStack) -> Iterator[PodRunner]:
    with pod_runner(stack.admin, stack.workdir) as runner:
        yield runner


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    async with udp_echo() as server:
        yield server.addr


async def _relays(local_port: int) -> bool:
    client = await udp_client(LOOPBACK, local_port)
    try:
        await client.roundtrip(b"ping through the cluster", timeout_s=1.0, retries=2)
    except TimeoutError:
        return False
    finally:
        client.close()
    return True


async def _relays_until_the_route_goes(
    stack: KubeStack, running: RunningPod, echo: tuple[str, int], what: str
) -> None:
    """turncat finds the Gateway through the CDS (``k8s://``) and relays to ``echo`` through
    ``what``; deleting the UDPRoute stops the relaying."""
    local = free_port(socket.SOCK_DGRAM)
    async with turncat(
        "--cds-server-address",
        f"{LOOPBACK}:{stack.cds_port}",
        f"udp://{LOOPBACK}:{local}",
        f"k8s://{NAMESPACE}/{GATEWAY}:{LISTENER}",
        f"udp://{echo[0]}:{echo[1]}",
        env={"CDS_TOKEN": stack.cds_token},
    ):
        try:
            await eventually(
                lambda: _relays(local), timeout_s=RELAY_WAIT_S, what=f"an echo through {what}"
            )
        except (AssertionError, TimeoutError):
            pytest.fail(f"no echo through {what}:\n{running.proc.output()[-2000:]}")
        stack.admin.delete("stunner.l7mp.io/v1", "UDPRoute", "echo-route", NAMESPACE)

        async def stopped() -> bool:
            return not await _relays(local)

        # Bounded by time, not by tries: a try that relays returns in milliseconds, so thirty
        # of them gave the change less than a second to reach the pod on a busy machine.
        await eventually(
            stopped, timeout_s=RELAY_WAIT_S, what=f"{what} to stop relaying once its UDPRoute went"
        )


async def test_a_gateway_gets_its_deployment_service_pod_and_relays_until_its_route_goes(
    stack: KubeStack, pods: PodRunner, echo: tuple[str, int]
) -> None:
    client = stack.admin
    port = free_udp_tcp_port()
    client.apply_all([*_objects(port), _route()])

    deployment = client.wait_for(
        "the Gateway's Deployment",
        lambda: client.get("apps/v1", "Deployment", GATEWAY, NAMESPACE),
    )
    service = client.wait_for(
        "the Gateway's Service", lambda: client.get("v1", "Service", GATEWAY, NAMESPACE)
    )
    owner = deployment["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Gateway", GATEWAY)
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["metadata"]["annotations"][LB_ANNOTATION[0]] == LB_ANNOTATION[1]
    assert [(p["name"], p["protocol"], p["port"]) for p in service["spec"]["ports"]] == [
        (LISTENER, "UDP", port)
    ]
    expressions = deployment["spec"]["selector"]["matchExpressions"]
    assert service["spec"]["selector"] == {e["key"]: e["values"][0] for e in expressions}

    # The ReplicaSet controller makes the pod; the kubelet stand-in runs it.
    running = await asyncio.to_thread(
        client.wait_for,
        "the stunnerd pod running",
        lambda: pods.pod_for_gateway(NAMESPACE, GATEWAY),
        timeout_s=60.0,
    )
    assert not pods.errors
    # A cloud provider's controller gives the Service its load-balancer address.
    client.patch_status(
        "v1", "Service", GATEWAY, NAMESPACE, {"loadBalancer": {"ingress": [{"ip": running.ip}]}}
    )

    def advertised() -> bool:
        config = stack.cds_configs().get(f"{NAMESPACE}/{GATEWAY}")
        listeners = (config or {}).get("listeners") or [{}]
        return bool(listeners[0].get("public_address") == running.ip)

    await asyncio.to_thread(client.wait_for, "the LB address in the config", advertised)

    def serving() -> bool:
        # The pod's readiness probe, as a kubelet would ask it: a listener is up.
        try:
            ready = httpx.get(f"http://{running.ip}:{running.health_port}/ready", timeout=1.0)
        except httpx.HTTPError:
            return False
        return ready.status_code == 200

    await asyncio.to_thread(client.wait_for, "the stunnerd pod ready", serving)

    await _relays_until_the_route_goes(stack, running, echo, "the cluster's stunnerd")


def test_deleting_the_gateway_removes_its_objects_through_the_garbage_collector(
    stack: KubeStack, pods: PodRunner
) -> None:
    client = stack.admin
    client.apply_all(_objects(free_udp_tcp_port()))
    client.wait_for(
        "the Gateway's Deployment", lambda: client.get("apps/v1", "Deployment", GATEWAY, NAMESPACE)
    )
    client.wait_for("the config", lambda: f"{NAMESPACE}/{GATEWAY}" in stack.cds_configs())

    client.delete("gateway.networking.k8s.io/v1", "Gateway", GATEWAY, NAMESPACE)

    client.wait_for(
        "the Deployment and Service gone",
        lambda: (
            client.get("apps/v1", "Deployment", GATEWAY, NAMESPACE) is None
            and client.get("v1", "Service", GATEWAY, NAMESPACE) is None
        ),
        timeout_s=60.0,
    )
    client.wait_for("the config gone", lambda: f"{NAMESPACE}/{GATEWAY}" not in stack.cds_configs())
    client.wait_for(
        "the pod gone",
        lambda: not client.list("v1", "Pod", NAMESPACE, label_selector="app=stunner"),
        timeout_s=60.0,
    )


IMAGE_ONLY = "image-only"


async def test_a_dataplane_with_only_an_image_follows_route_edits(
    stack: KubeStack, pods: PodRunner, echo: tuple[str, int]
) -> None:
    """The Dataplane users write first: an image and nothing else. The pod must still follow
    the CDS, so deleting the route stops the relaying."""
    client = stack.admin
    port = free_udp_tcp_port()
    image = "localhost/stunner-stunnerd:test"
    dataplane: dict[str, Any] = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "Dataplane",
        "metadata": {"name": IMAGE_ONLY},
        "spec": {"image": image},
    }
    objects = echo_gateway(GATEWAY, LISTENER, port, config_spec={"dataplane": IMAGE_ONLY})
    client.apply_all([dataplane, *objects])
    try:
        deployment = client.wait_for(
            "the Gateway's Deployment from the image-only Dataplane",
            lambda: (
                d
                if (d := client.get("apps/v1", "Deployment", GATEWAY, NAMESPACE))
                and d["spec"]["template"]["spec"]["containers"][0]["image"] == image
                else None
            ),
        )
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert (container["command"], container["args"]) == (["stunnerd"], ["-w"])
        template = deployment["spec"]["template"]["metadata"]["labels"]

        def new_pod() -> Any:
            # The previous test's pod may still be going: this Deployment's pod is the one.
            running = pods.pod_for_gateway(NAMESPACE, GATEWAY)
            pod = running and client.get("v1", "Pod", running.name, NAMESPACE)
            labels = (pod or {}).get("metadata", {}).get("labels", {})
            return running if pod and all(labels.get(k) == v for k, v in template.items()) else None

        running = await asyncio.to_thread(
            client.wait_for, "the image-only stunnerd pod running", new_pod, timeout_s=60.0
        )
        client.patch_status(
            "v1", "Service", GATEWAY, NAMESPACE, {"loadBalancer": {"ingress": [{"ip": running.ip}]}}
        )

        def advertised() -> bool:
            config = stack.cds_configs().get(f"{NAMESPACE}/{GATEWAY}")
            (listener,) = (config or {}).get("listeners") or [{}]
            return bool(
                (listener.get("public_address"), listener.get("port")) == (running.ip, port)
            )

        await asyncio.to_thread(client.wait_for, "this Gateway's config advertised", advertised)
        await _relays_until_the_route_goes(stack, running, echo, "the image-only pod")
    finally:
        client.delete("gateway.networking.k8s.io/v1", "Gateway", GATEWAY, NAMESPACE)
        client.apply_all(_objects(free_udp_tcp_port())[:2])  # the GatewayConfig without it
        client.delete("stunner.l7mp.io/v1", "Dataplane", IMAGE_ONLY, None)


SLICE_GATEWAY = "slice-gateway"


def _slice(addresses: list[str], resource_version: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": "slice-svc-manual",
        "namespace": NAMESPACE,
        "labels": {
            "kubernetes.io/service-name": "slice-svc",
            "endpointslice.kubernetes.io/managed-by": "tests.stunner.l7mp.io",
        },
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
        "ports": [{"name": "media", "port": 9001, "protocol": "UDP"}],
    }


def _served_endpoints(stack: KubeStack) -> set[str]:
    config = stack.cds_configs(f"{NAMESPACE}/{SLICE_GATEWAY}").get(f"{NAMESPACE}/{SLICE_GATEWAY}")
    clusters = (config or {}).get("clusters") or []
    return {e for c in clusters for e in c.get("endpoints") or []}


def test_an_endpointslice_updated_as_its_controller_does_reaches_the_config(
    stack: KubeStack,
) -> None:
    """Kubernetes' EndpointSlice controller updates a slice with a PUT (`KubeClient.replace`,
    which the churn of `bench control` writes with): the operator follows each update into the
    config the CDS serves, and an update naming a resourceVersion that is no longer current is
    refused (409) and changes nothing."""
    client = stack.admin
    objects = _objects(free_udp_tcp_port())
    for obj in objects:
        if obj["kind"] == "Gateway":
            obj["metadata"]["name"] = SLICE_GATEWAY
    client.apply_all(
        [
            *objects,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "slice-svc", "namespace": NAMESPACE},
                "spec": {"ports": [{"name": "media", "port": 9001, "protocol": "UDP"}]},
            },
            _slice(["10.30.0.1", "10.30.0.2"]),
            {
                "apiVersion": "stunner.l7mp.io/v1",
                "kind": "UDPRoute",
                "metadata": {"name": "slice-route", "namespace": NAMESPACE},
                "spec": {
                    "parentRefs": [{"name": SLICE_GATEWAY}],
                    "rules": [{"backendRefs": [{"name": "slice-svc"}]}],
                },
            },
        ]
    )
    try:
        client.wait_for(
            "the slice's endpoints in the config",
            lambda: {"10.30.0.1", "10.30.0.2"} <= _served_endpoints(stack),
            timeout_s=60.0,
        )
        updated = client.replace(_slice(["10.30.0.3"]))
        assert updated["endpoints"] == [{"addresses": ["10.30.0.3"], "conditions": {"ready": True}}]
        client.wait_for(
            "the updated endpoints in the config",
            lambda: (
                "10.30.0.3" in _served_endpoints(stack)
                and not {"10.30.0.1", "10.30.0.2"} & _served_endpoints(stack)
            ),
        )
        stale = updated["metadata"]["resourceVersion"]
        client.replace(_slice(["10.30.0.4"], stale))  # current: accepted
        with pytest.raises(KubeError) as refused:
            client.replace(_slice(["10.30.0.5"], stale))
        assert refused.value.status == 409
        client.wait_for(
            "the accepted update in the config", lambda: "10.30.0.4" in _served_endpoints(stack)
        )
        assert "10.30.0.5" not in _served_endpoints(stack)
        current = client.get("discovery.k8s.io/v1", "EndpointSlice", "slice-svc-manual", NAMESPACE)
        assert current is not None
        assert current["endpoints"][0]["addresses"] == ["10.30.0.4"]
    finally:
        client.delete("gateway.networking.k8s.io/v1", "Gateway", SLICE_GATEWAY, NAMESPACE)
        client.delete("stunner.l7mp.io/v1", "UDPRoute", "slice-route", NAMESPACE)
        client.delete("discovery.k8s.io/v1", "EndpointSlice", "slice-svc-manual", NAMESPACE)
        client.delete("v1", "Service", "slice-svc", NAMESPACE)
