"""A listener's port: the Gateway's ``spec.port``, and the port stunnerd binds.

A Gateway listener's ``port`` is what clients reach (the Service port). The
``stunner.l7mp.io/targetport`` annotation (``{"listener": port}``) moves the port stunnerd binds:
the operator renders it as the listener's port in the stunnerd config, as the Service port's
``targetPort`` and as the pod's container (host) port, so the three must read it alike. One
parser (also for the ``nodeport`` annotation, which has the same shape) and one rule,
`TargetPorts.bound_port`, live here; the operator's render modules only call them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

TARGETPORT_ANNOTATION: Final = "stunner.l7mp.io/targetport"
"""Gateway (or GatewayConfig LB) annotation: listener name -> the port stunnerd binds."""

MIN_PORT: Final = 1
MAX_PORT: Final = 65535


def parse_port_map(annotations: Mapping[str, str], key: str) -> tuple[dict[str, int], list[str]]:
    """The JSON ``{"listener": port}`` map of a nodeport/targetport annotation, and its problems.

    GATEWAY.md's examples leave the braces out (``"udp-listener": 30000``), so a bare list of
    pairs is read as if braced. Entries that are not a port (an integer in 1-65535) are dropped
    and named in the problems, as is an annotation that is not such a map at all.
    """
    raw = annotations.get(key)
    if raw is None:
        return {}, []
    data: Any = None
    for text in (raw, "{" + raw + "}"):
        try:
            data = json.loads(text)
            break
        except json.JSONDecodeError:
            continue
    if not isinstance(data, dict):
        return {}, [f"annotation {key}: {raw!r} is not a JSON map of listener name to port"]
    out: dict[str, int] = {}
    problems: list[str] = []
    for name, port in data.items():
        if isinstance(port, int) and not isinstance(port, bool) and MIN_PORT <= port <= MAX_PORT:
            out[str(name)] = port
        else:
            problems.append(
                f"annotation {key}: port {port!r} of listener {name!r} is not in 1-65535"
            )
    return out, problems


@dataclass(frozen=True, slots=True)
class TargetPorts:
    """The targetport annotation, decoded: the valid entries and what was wrong with the rest."""

    ports: Mapping[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @classmethod
    def decode(cls, annotations: Mapping[str, str]) -> TargetPorts:
        ports, problems = parse_port_map(annotations, TARGETPORT_ANNOTATION)
        return cls(ports, tuple(problems))

    def encode(self) -> str:
        """The annotation's value for these ports (listener names sorted)."""
        return json.dumps(dict(sorted(self.ports.items())))

    def get(self, listener: str) -> int | None:
        """The port the annotation names for `listener` (None: it names none)."""
        return self.ports.get(listener)

    def bound_port(self, listener: str, spec_port: int) -> int:
        """The port stunnerd binds for `listener`: the annotation's, else the listener's own."""
        return self.ports.get(listener, spec_port)
