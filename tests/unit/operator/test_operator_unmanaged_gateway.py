"""A Gateway that stops being ours loses its Service and Deployment at once."""

from __future__ import annotations

from stunner_operator.render.engine import Renderer
from support.operator import HIERARCHY, UDP_GATEWAY, objects_from_yaml


def test_a_gateway_moved_to_another_class_gets_its_service_and_deployment_deleted() -> None:
    renderer = Renderer()
    first = renderer.apply(objects_from_yaml(HIERARCHY + "---" + UDP_GATEWAY))
    assert first.services["stunner/gw"] is not None
    assert first.deployments["stunner/gw"] is not None
    moved = renderer.apply(
        objects_from_yaml(UDP_GATEWAY.replace("gatewayClassName: stunner", "gatewayClassName: x"))
    )
    assert {("Service", "stunner", "gw"), ("Deployment", "stunner", "gw")} <= set(
        moved.resource_deletes
    )
    assert "stunner/gw" in moved.deleted


def test_a_deleted_gateway_gets_its_service_and_deployment_deleted_without_waiting_for_gc() -> None:
    renderer = Renderer()
    renderer.apply(objects_from_yaml(HIERARCHY + "---" + UDP_GATEWAY))
    gone = renderer.apply(deletes=[("Gateway", "stunner", "gw")])
    assert {("Service", "stunner", "gw"), ("Deployment", "stunner", "gw")} <= set(
        gone.resource_deletes
    )


def test_an_unchanged_gateway_deletes_nothing() -> None:
    renderer = Renderer()
    renderer.apply(objects_from_yaml(HIERARCHY + "---" + UDP_GATEWAY))
    again = renderer.apply(objects_from_yaml(HIERARCHY))
    assert not again.resource_deletes
