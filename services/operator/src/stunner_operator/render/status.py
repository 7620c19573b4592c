"""The statuses the renderer computes for GatewayClasses, Gateways and UDPRoutes.

Statuses are plain frozen values so that the engine can compare them to spot real changes, local
mode can log them as one line per object, and the cluster controller can write them with
``to_k8s()``. Reasons are those of the Gateway API; messages say what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONTROLLER_NAME = "stunner.l7mp.io/gateway-operator"

RouteKind = tuple[str, str]
"""(group, kind) of a route a listener takes."""

SUPPORTED_KINDS: tuple[RouteKind, ...] = (
    ("gateway.networking.k8s.io", "UDPRoute"),
    ("stunner.l7mp.io", "UDPRoute"),
)

SUPPORTED_FEATURES: tuple[str, ...] = ("Gateway", "UDPRoute")
"""Gateway API conformance features (GEP-2162) every GatewayClass of ours claims; ReferenceGrant
joins them where grants are enforced (``RenderOptions.enforce_reference_grants``)."""


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str = ""

    def to_k8s(self, generation: int) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": generation,
        }

    def short(self) -> str:
        if self.status == "True":
            return f"{self.type}"
        return f"{self.type}={self.status}({self.reason}: {self.message})"


def true(type_: str, reason: str, message: str = "") -> Condition:
    return Condition(type_, "True", reason, message)


def false(type_: str, reason: str, message: str = "") -> Condition:
    return Condition(type_, "False", reason, message)


def unknown(type_: str, reason: str, message: str = "") -> Condition:
    return Condition(type_, "Unknown", reason, message)


def _find(conds: tuple[Condition, ...], type_: str) -> Condition | None:
    return next((c for c in conds if c.type == type_), None)


@dataclass(frozen=True, slots=True)
class GatewayClassStatus:
    generation: int
    conditions: tuple[Condition, ...]
    supported_features: tuple[str, ...] = ()

    def to_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {"conditions": [c.to_k8s(self.generation) for c in self.conditions]}
        if self.supported_features:
            out["supportedFeatures"] = [{"name": f} for f in sorted(self.supported_features)]
        return out

    def summary(self) -> str:
        return ", ".join(c.short() for c in self.conditions)


@dataclass(frozen=True, slots=True)
class ListenerStatus:
    name: str
    attached_routes: int
    conditions: tuple[Condition, ...]
    supported_kinds: tuple[RouteKind, ...] = SUPPORTED_KINDS

    def to_k8s(self, generation: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "supportedKinds": [{"group": g, "kind": k} for g, k in self.supported_kinds],
            "attachedRoutes": self.attached_routes,
            "conditions": [c.to_k8s(generation) for c in self.conditions],
        }

    def condition(self, type_: str) -> Condition | None:
        return _find(self.conditions, type_)

    def summary(self) -> str:
        bad = [c.short() for c in self.conditions if c.status != _GOOD.get(c.type, "True")]
        state = "; ".join(bad) if bad else "ready"
        return f"{self.name} {state}, {self.attached_routes} route(s)"


_GOOD = {"Conflicted": "False"}


@dataclass(frozen=True, slots=True)
class GatewayStatus:
    generation: int
    conditions: tuple[Condition, ...]
    listeners: tuple[ListenerStatus, ...]
    addresses: tuple[tuple[str, str], ...] = ()  # (type, value)

    def to_k8s(self) -> dict[str, Any]:
        return {
            "conditions": [c.to_k8s(self.generation) for c in self.conditions],
            "listeners": [ls.to_k8s(self.generation) for ls in self.listeners],
            "addresses": [{"type": t, "value": v} for t, v in self.addresses],
        }

    def condition(self, type_: str) -> Condition | None:
        return _find(self.conditions, type_)

    def summary(self) -> str:
        head = ", ".join(c.short() for c in self.conditions)
        addr = ",".join(v for _, v in self.addresses) or "no address"
        listeners = "; ".join(ls.summary() for ls in self.listeners)
        return f"{head} [{addr}] listeners: {listeners or 'none'}"


@dataclass(frozen=True, slots=True)
class ParentRef:
    name: str
    namespace: str | None = None
    section_name: str | None = None
    group: str | None = None
    kind: str | None = None
    port: int | None = None

    def to_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.port is not None:
            out["port"] = self.port
        if self.group is not None:
            out["group"] = self.group
        if self.kind is not None:
            out["kind"] = self.kind
        if self.namespace is not None:
            out["namespace"] = self.namespace
        if self.section_name is not None:
            out["sectionName"] = self.section_name
        return out

    def label(self, route_ns: str) -> str:
        text = f"{self.namespace or route_ns}/{self.name}"
        return f"{text}:{self.section_name}" if self.section_name else text


@dataclass(frozen=True, slots=True)
class RouteParentStatus:
    parent_ref: ParentRef
    conditions: tuple[Condition, ...]

    def to_k8s(self, generation: int) -> dict[str, Any]:
        return {
            "parentRef": self.parent_ref.to_k8s(),
            "controllerName": CONTROLLER_NAME,
            "conditions": [c.to_k8s(generation) for c in self.conditions],
        }

    def condition(self, type_: str) -> Condition | None:
        return _find(self.conditions, type_)


@dataclass(frozen=True, slots=True)
class RouteStatus:
    generation: int
    namespace: str
    parents: tuple[RouteParentStatus, ...]

    def to_k8s(self) -> dict[str, Any]:
        return {"parents": [p.to_k8s(self.generation) for p in self.parents]}

    def summary(self) -> str:
        parts = []
        for p in self.parents:
            conds = ", ".join(c.short() for c in p.conditions)
            parts.append(f"parent {p.parent_ref.label(self.namespace)}: {conds}")
        return "; ".join(parts) or "no parents"


Status = GatewayClassStatus | GatewayStatus | RouteStatus
