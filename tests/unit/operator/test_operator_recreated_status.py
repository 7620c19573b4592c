"""An object deleted and created again under the same name between two renders (one event batch)
is a new object: its status is written again even when the render did not change, or it would
keep the API server's default (a GatewayClass stuck at Accepted Unknown/Pending). Found by
``make conformance`` (docs/upstream-differences.md)."""

from __future__ import annotations

from collections.abc import Callable

from stunner_common.crds import K8sObject
from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, UDP_GATEWAY, objects_from_yaml

Render = Callable[..., Renderer]

ROUTE = """
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata: {name: r, namespace: stunner}
spec: {parentRefs: [{name: gw}], rules: [{backendRefs: [{name: s}]}]}
"""


def with_uid(text: str, kind: str, uid: str) -> list[K8sObject]:
    objs = objects_from_yaml(text)
    return [
        o.model_copy(update={"metadata": o.metadata.model_copy(update={"uid": uid})})
        if o.kind == kind
        else o
        for o in objs
    ]


def test_a_re_created_object_gets_its_unchanged_status_again(render: Render) -> None:
    r = render()
    first = [
        *with_uid(HIERARCHY, "GatewayClass", "class-1"),
        *with_uid(UDP_GATEWAY, "Gateway", "gw-1"),
        *with_uid(ROUTE, "UDPRoute", "route-1"),
    ]
    delta = r.apply(first)
    keys = {
        ("GatewayClass", "", "stunner"),
        ("Gateway", "stunner", "gw"),
        ("UDPRoute", "stunner", "r"),
    }
    assert keys <= set(delta.statuses)
    # The same objects again (a resync): nothing to write.
    assert not keys & set(r.apply(first).statuses)
    # Deleted and created again in one batch: the store sees only new uids.
    again = [
        *with_uid(HIERARCHY, "GatewayClass", "class-2"),
        *with_uid(UDP_GATEWAY, "Gateway", "gw-2"),
        *with_uid(ROUTE, "UDPRoute", "route-2"),
    ]
    delta = r.apply(again)
    assert keys <= set(delta.statuses)
    assert all(delta.statuses[k] is not None for k in keys)


def test_an_object_re_created_right_after_its_first_render_gets_its_status_again(
    render: Render,
) -> None:
    """No render in between that left the status unchanged: the first one (which emitted a
    changed status) must have recorded the uid too."""
    r = render()
    keys = {
        ("GatewayClass", "", "stunner"),
        ("Gateway", "stunner", "gw"),
        ("UDPRoute", "stunner", "r"),
    }
    delta = r.apply(
        [
            *with_uid(HIERARCHY, "GatewayClass", "class-1"),
            *with_uid(UDP_GATEWAY, "Gateway", "gw-1"),
            *with_uid(ROUTE, "UDPRoute", "route-1"),
        ]
    )
    assert keys <= set(delta.statuses)
    delta = r.apply(
        [
            *with_uid(HIERARCHY, "GatewayClass", "class-2"),
            *with_uid(UDP_GATEWAY, "Gateway", "gw-2"),
            *with_uid(ROUTE, "UDPRoute", "route-2"),
        ]
    )
    assert keys <= set(delta.statuses)
    assert all(delta.statuses[k] is not None for k in keys)
