"""The Dataplane's ``handoff``: a DaemonSet on the host network whose new pod takes over the old
one's sockets through a hostPath Unix socket, and what the operator says where it cannot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stunner_operator.render.engine import Renderer
from stunner_operator.render.handoff import handoff_dir_command
from support.operator import HIERARCHY, UDP_GATEWAY

Render = Callable[..., Renderer]

HANDOFF = "dataplaneResource: DaemonSet, hostNetwork: true, handoff: true"


def dataplane(fields: str) -> str:
    return HIERARCHY.replace(
        'spec: {image: "stunnerd:test"}', f'spec: {{image: "stunnerd:test", {fields}}}'
    )


def workload(r: Renderer) -> dict[str, Any]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    assert gw.deployment is not None
    return gw.deployment


def warnings(r: Renderer) -> tuple[str, ...]:
    gw = r.gateway("stunner", "gw")
    assert gw is not None
    return tuple(gw.warnings)


def test_handoff_renders_a_surge_rollout_and_the_hostpath_socket(render: Render) -> None:
    r = render(dataplane(HANDOFF), UDP_GATEWAY)
    ds = workload(r)
    assert ds["kind"] == "DaemonSet"
    # the new pod starts beside the old one, on its node
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    # Ready comes from the old stunnerd until the handoff (one health port on the node)
    assert ds["spec"]["minReadySeconds"] == 10
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["volumes"] == [
        {
            "name": "stunner-handoff",
            "hostPath": {"path": "/var/run/stunner", "type": "DirectoryOrCreate"},
        }
    ]
    (container,) = pod["containers"]
    assert container["volumeMounts"] == [
        {"name": "stunner-handoff", "mountPath": "/var/run/stunner"}
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STUNNERD_HANDOFF_SOCKET"] == "/var/run/stunner/stunner_gw.sock"
    assert env["STUNNERD_HANDOFF_IDLE"] == "true"
    # every declared port of a host-network pod is a host port, which the scheduler would not
    # give the surge pod while the old one holds it
    assert "ports" not in container
    assert container["securityContext"] == {
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "runAsNonRoot": True,
    }
    assert pod["terminationGracePeriodSeconds"] == 30
    assert warnings(r) == ()


def test_a_root_init_container_makes_the_directory_the_stunnerd_users(render: Render) -> None:
    pod = workload(render(dataplane(HANDOFF), UDP_GATEWAY))["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["image"] == "stunnerd:test"
    assert init["imagePullPolicy"] == pod["containers"][0]["imagePullPolicy"]
    assert init["command"] == handoff_dir_command(10001, 10001)
    assert init["command"][-3:] == ["/var/run/stunner", "10001", "10001"]
    assert init["securityContext"] == {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    assert init["volumeMounts"] == [{"name": "stunner-handoff", "mountPath": "/var/run/stunner"}]


@pytest.mark.parametrize(
    ("contexts", "ids"),
    [
        ("containerSecurityContext: {runAsUser: 2000, runAsGroup: 3000}", ("2000", "3000")),
        ("securityContext: {runAsUser: 2000}", ("2000", "2000")),
        (
            "securityContext: {runAsUser: 2000, runAsGroup: 2001}, "
            "containerSecurityContext: {runAsUser: 4000}",
            ("4000", "2001"),
        ),
    ],
)
def test_the_directory_belongs_to_the_uid_stunnerd_runs_as(
    render: Render, contexts: str, ids: tuple[str, str]
) -> None:
    pod = workload(render(dataplane(f"{HANDOFF}, {contexts}"), UDP_GATEWAY))["spec"]["template"][
        "spec"
    ]
    command = pod["initContainers"][0]["command"]
    assert tuple(command[-2:]) == ids
    context = pod["containers"][0]["securityContext"]
    assert (str(context["runAsUser"]), str(context["runAsGroup"])) == ids


def test_the_dataplane_env_overrides_the_handoff_env(render: Render) -> None:
    fields = f"{HANDOFF}, env: [{{name: STUNNERD_HANDOFF_IDLE, value: 'false'}}]"
    container = workload(render(dataplane(fields), UDP_GATEWAY))["spec"]["template"]["spec"][
        "containers"
    ][0]
    idle = [e["value"] for e in container["env"] if e["name"] == "STUNNERD_HANDOFF_IDLE"]
    assert idle == ["true", "false"]  # the last one counts


@pytest.mark.parametrize(
    "fields",
    [
        "handoff: true",
        "hostNetwork: true, handoff: true",
        "dataplaneResource: DaemonSet, handoff: true",
    ],
)
def test_handoff_without_a_host_network_daemonset_says_what_it_needs(
    render: Render, fields: str
) -> None:
    r = render(dataplane(fields), UDP_GATEWAY)
    without = render(dataplane(fields.replace("handoff: true", "handoff: false")), UDP_GATEWAY)
    assert workload(r) == workload(without)  # rendered as if not asked
    (warning,) = warnings(r)
    assert "handoff needs dataplaneResource: DaemonSet and hostNetwork: true" in warning
    assert "stunner/gw" in r.configs()


def test_without_handoff_the_host_network_daemonset_is_unchanged(render: Render) -> None:
    ds = workload(render(dataplane("dataplaneResource: DaemonSet, hostNetwork: true"), UDP_GATEWAY))
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "minReadySeconds" not in ds["spec"]
    pod = ds["spec"]["template"]["spec"]
    assert "volumes" not in pod
    assert "initContainers" not in pod
    assert not any(e["name"].startswith("STUNNERD_HANDOFF") for e in pod["containers"][0]["env"])
