"""The real-server tier: one test cluster with the chart and the operator for this folder.

Every test here is marked ``kube``; `make test-kube` runs them (CI does, after `make test`). The
Go build of the control plane happens once per machine (support.gobin); without Go the tests
skip, except under CI=true, where they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.kube_stack import KubeStack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.kube)
            if item.get_closest_marker("timeout") is None:  # a module may ask for more
                item.add_marker(pytest.mark.timeout(300))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    """The cluster with Gateway API, the chart, Redis, the CDS and the operator (as its SA)."""
    stack = KubeStack(tmp_path_factory.mktemp("kube"))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
