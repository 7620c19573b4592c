"""The listener-port contract: the targetport annotation and the port stunnerd binds."""

from __future__ import annotations

import pytest

from stunner_common.contracts.listener_port import (
    TARGETPORT_ANNOTATION,
    TargetPorts,
    parse_port_map,
)


@pytest.mark.parametrize(
    "ports",
    [{}, {"udp-listener": 30000}, {"a": 1, "b": 65535, "c": 3478}],
)
def test_the_annotation_round_trips(ports: dict[str, int]) -> None:
    encoded = TargetPorts(ports).encode()
    decoded = TargetPorts.decode({TARGETPORT_ANNOTATION: encoded})
    assert decoded == TargetPorts(ports)
    assert decoded.problems == ()


def test_the_braceless_form_of_gateway_md_is_read_as_a_map() -> None:
    decoded = TargetPorts.decode({TARGETPORT_ANNOTATION: '"udp-listener": 30000'})
    assert decoded.ports == {"udp-listener": 30000}


@pytest.mark.parametrize(
    ("raw", "ports", "problem"),
    [
        ("[1, 2]", {}, "is not a JSON map of listener name to port"),
        ('{"a": 0, "b": 3478}', {"b": 3478}, "port 0 of listener 'a' is not in 1-65535"),
        ('{"a": true}', {}, "port True of listener 'a' is not in 1-65535"),
        ('{"a": "3478"}', {}, "port '3478' of listener 'a' is not in 1-65535"),
    ],
)
def test_entries_that_are_not_ports_are_dropped_and_named(
    raw: str, ports: dict[str, int], problem: str
) -> None:
    decoded = TargetPorts.decode({TARGETPORT_ANNOTATION: raw})
    assert decoded.ports == ports
    assert len(decoded.problems) == 1
    assert decoded.problems[0].startswith(f"annotation {TARGETPORT_ANNOTATION}: ")
    assert problem in decoded.problems[0]


def test_stunnerd_binds_the_annotated_port_else_the_listener_port() -> None:
    ports = TargetPorts.decode({TARGETPORT_ANNOTATION: '{"moved": 40000}'})
    assert ports.bound_port("moved", 3478) == 40000
    assert ports.bound_port("kept", 3478) == 3478
    assert ports.get("kept") is None


def test_an_absent_annotation_is_no_ports_and_no_problems() -> None:
    assert TargetPorts.decode({}) == TargetPorts()
    assert parse_port_map({}, "stunner.l7mp.io/nodeport") == ({}, [])
