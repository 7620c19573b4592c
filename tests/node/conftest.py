"""The real-node tier: one cluster with a real kubelet, containerd, CNI and kube-proxy.

Every test here is marked ``node``; `make test-node` runs them (as root, after `make images`).
Where the machine cannot run a node at all (not root, no br_netfilter) the tests skip saying
why; where only software is missing (Go, containerd, CNI plugins, the stunnerd image) they skip
too, except under CI=true, where they fail: CI must run them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.node_images import podman_image_exists, stunnerd_image
from support.node_stack import NodeStack, machine_lacks, missing_requirements


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.node)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(300))


def _unavailable(reason: str, *, machine: bool) -> None:
    if os.environ.get("CI") == "true" and not machine:
        pytest.fail(reason + " (CI must run the node tests)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeStack]:
    """The one-node cluster, Ready, with the stunnerd image imported into its containerd."""
    lacking = machine_lacks()
    if lacking:
        _unavailable("this machine cannot run a node: " + "; ".join(lacking), machine=True)
    missing = missing_requirements()
    if missing:
        _unavailable("a real node needs " + "; ".join(missing), machine=False)
    image = stunnerd_image()
    if not podman_image_exists(image):
        _unavailable(f"podman has no {image}: run make base-image and make images", machine=False)
    stack = NodeStack(tmp_path_factory.mktemp("node"))
    try:
        stack.start()
        stack.import_image(image)
        yield stack
    finally:
        report = stack.stop()
        leftovers = {k: v for k, v in report.items() if k == "cgroups-stuck" and v}
        assert not leftovers, f"the node left {leftovers}"


@pytest.fixture
def namespace(node: NodeStack, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, deleted (with its pods) when it ends."""
    name = "t-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].strip("-")
    node.admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    node.admin.wait_for(
        f"default ServiceAccount in {name}",
        lambda: node.admin.get("v1", "ServiceAccount", "default", name),
    )
    try:
        yield name
    finally:
        node.admin.delete("v1", "Namespace", name)
