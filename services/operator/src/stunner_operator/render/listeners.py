"""One Gateway listener on its way into the stunnerd config: its state, address and status.

`render_gateway` (in ``gateway.py``) walks the listeners in spec order and records on a
`_ListenerState` what it finds: conflicts, TLS material from Secrets, the public address from the
Service or the nodes (https://github.com/l7mp/stunner/blob/main/docs/GATEWAY.md). This module
holds that per-listener state and the pieces that read or render it (the `ListenerConfig` and the
listener's status conditions), so ``gateway.py`` keeps only the Gateway-level flow.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass, field
from typing import Any

from stunner_common.config import ConfigError, ListenerConfig, load_tls_pair
from stunner_common.contracts.listener_address import POD_ADDRESS
from stunner_common.contracts.listener_port import TargetPorts
from stunner_common.crds import GATEWAY_GROUP, Gateway, Listener, Secret, Service
from stunner_operator.render.grants import Reference, not_permitted_message, reference_permitted
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.routes import allowed_kinds
from stunner_operator.render.status import Condition, ListenerStatus, false, true
from stunner_operator.render.store import View

_SERVICE_TYPE_RANK = {"LoadBalancer": 0, "ExternalName": 1, "NodePort": 2, "ClusterIP": 3}


@dataclass(slots=True)
class _ListenerState:
    spec: Listener
    protocol: str | None
    conflict: str | None = None
    conflict_reason: str = "ProtocolConflict"
    cert: tuple[str, str] | None = None
    tls_error: str | None = None
    tls_reason: str = "InvalidCertificateRef"
    public: tuple[str, str, int] | None = None
    exposed: bool = False
    attached: int = 0
    routes: set[str] = field(default_factory=set)

    @property
    def renderable(self) -> bool:
        return self.protocol is not None and self.conflict is None and self.tls_error is None

    def why_not(self) -> str:
        """Why this listener is left out of the config ("" when it is not)."""
        if self.protocol is None:
            return f"unsupported protocol {self.spec.protocol!r}"
        return self.conflict or self.tls_error or ""


def _tls_material(
    view: View, gw: Gateway, ls: Listener, options: RenderOptions
) -> tuple[tuple[str, str] | None, str, str]:
    """The (cert, key) of the first usable certificateRef, base64 of the PEM; else why not,
    and the listener's ResolvedRefs reason for it."""
    invalid = "InvalidCertificateRef"
    tls = ls.tls
    if tls is None or not tls.certificate_refs:
        return None, f"listener {ls.name} needs tls.certificateRefs", invalid
    if tls.mode not in (None, "Terminate"):
        return (
            None,
            f"listener {ls.name}: tls.mode {tls.mode} is not supported, use Terminate",
            invalid,
        )
    problem, reason = "", invalid
    for ref in tls.certificate_refs:
        if (ref.group or "") not in ("", "v1") or (ref.kind or "Secret") != "Secret":
            problem, reason = (
                f"listener {ls.name}: certificateRef {ref.name} must be a Secret",
                invalid,
            )
            continue
        ns = ref.namespace or gw.metadata.namespace
        grant = Reference(
            GATEWAY_GROUP, "Gateway", gw.metadata.namespace, "", "Secret", ns, ref.name
        )
        if not reference_permitted(view, grant, options):
            problem = f"listener {ls.name}: {not_permitted_message(grant)}"
            reason = "RefNotPermitted"
            continue
        reason = invalid
        secret = view.get(Secret, ns, ref.name)
        if secret is None:
            problem = f"Secret {ns}/{ref.name} not found"
            continue
        values = secret.values()
        cert = next((values[k] for k in ("tls.crt", "crt", "cert") if k in values), None)
        key = next((values[k] for k in ("tls.key", "key") if k in values), None)
        if not cert or not key:
            problem = f"Secret {ns}/{ref.name} needs the keys tls.crt and tls.key"
            continue
        pair = (base64.b64encode(cert).decode(), base64.b64encode(key).decode())
        unusable = _tls_problem(*pair)
        if unusable:
            problem = f"Secret {ns}/{ref.name}: {unusable}"
            continue
        return pair, "", ""
    return None, problem, reason


@functools.lru_cache(maxsize=256)
def _tls_problem(cert_b64: str, key_b64: str) -> str:
    """Why stunnerd could not load this pair ("" when it can): PEM that does not parse, a key
    that does not match the certificate. Checked here so that the listener is left out with
    ResolvedRefs=False instead of being rejected by every stunnerd of the Gateway."""
    try:
        load_tls_pair(cert_b64, key_b64)
    except ConfigError as exc:
        return str(getattr(exc, "message", exc))
    return ""


def _public_service(view: View, gw: Gateway) -> Service | None:
    """The Service the operator made for ``gw`` (annotated and owner-referenced to it)."""
    candidates = []
    for svc in view.services_of(gw.metadata.namespace, gw.metadata.name):
        if svc.metadata.namespace != gw.metadata.namespace:
            continue
        owners = svc.metadata.owner_references
        if owners and not any(
            o.kind == "Gateway"
            and o.name == gw.metadata.name
            and (not o.uid or not gw.metadata.uid or o.uid == gw.metadata.uid)
            for o in owners
        ):
            continue
        candidates.append(svc)
    if not candidates:
        return None
    return min(candidates, key=lambda s: (_SERVICE_TYPE_RANK.get(s.spec.type, 9), s.metadata.name))


def _node_address(view: View) -> tuple[str, str] | None:
    nodes = view.nodes()
    for wanted, addr_type in (("ExternalIP", "IPAddress"), ("ExternalDNS", "Hostname")):
        for node in nodes:
            for addr in node.status.addresses:
                if addr.type == wanted and addr.address:
                    return addr_type, addr.address
    return None


def _public_address(
    view: View,
    gw: Gateway,
    ls: Listener,
    svc_proto: str,
    stored: Service | None,
    desired: dict[str, Any] | None,
) -> tuple[str, str, int] | None:
    """(type, address, port) clients use to reach ``ls``."""
    node_port: int | None
    if stored is not None:
        sport = next(
            (p for p in stored.spec.ports if p.port == ls.port and p.protocol.upper() == svc_proto),
            None,
        )
        if sport is None:
            return None
        port, node_port, svc_type = sport.port, sport.node_port, stored.spec.type
    else:
        # Nothing applied yet (or local mode): the Service this render asks for is what counts.
        if desired is None:
            return None
        dport = next((p for p in desired["spec"]["ports"] if p["name"] == ls.name), None)
        if dport is None:
            return None
        port, node_port, svc_type = dport["port"], dport.get("nodePort"), desired["spec"]["type"]
    if gw.spec.addresses and gw.spec.addresses[0].value:
        hint = gw.spec.addresses[0]
        return hint.type or "IPAddress", hint.value, port
    if stored is not None and svc_type == "LoadBalancer":
        ingress = stored.status.load_balancer.ingress
        match = next(
            (
                ing
                for ing in ingress
                if any(p.port == port and p.protocol.upper() == svc_proto for p in ing.ports)
            ),
            ingress[0] if ingress else None,
        )
        if match is not None and (match.ip or match.hostname):
            return ("IPAddress", match.ip, port) if match.ip else ("Hostname", match.hostname, port)
    if node_port:
        node = _node_address(view)
        if node is not None:
            return node[0], node[1], node_port
    return None


def _listener_config(
    ns: str, name: str, st: _ListenerState, targetports: TargetPorts
) -> ListenerConfig:
    ls = st.spec
    assert st.protocol is not None
    fields: dict[str, Any] = {
        "name": f"{ns}/{name}/{ls.name}",
        "protocol": st.protocol,
        "address": POD_ADDRESS,
        "port": targetports.bound_port(ls.name, ls.port),
        "routes": tuple(sorted(st.routes)),
    }
    if st.public is not None:
        fields["public_address"] = st.public[1]
        fields["public_port"] = st.public[2]
    if st.cert is not None:
        fields["cert"], fields["key"] = st.cert
    return ListenerConfig(**fields)


def _listener_status(st: _ListenerState) -> ListenerStatus:
    ls = st.spec
    conds: tuple[Condition, ...]
    left_out = f"listener {ls.name} is left out of the dataplane config: {st.why_not()}"
    if st.protocol is None:
        conds = (
            false(
                "Accepted",
                "UnsupportedProtocol",
                f"listener {ls.name}: unsupported protocol {ls.protocol!r} "
                "(use TURN-UDP, TURN-TCP, TURN-TLS or TURN-DTLS)",
            ),
            false("Conflicted", "NoConflicts"),
            true("ResolvedRefs", "ResolvedRefs"),
            false("Programmed", "Invalid", left_out),
        )
        return ListenerStatus(ls.name, 0, conds, ())
    kinds, bad_kinds = allowed_kinds(ls)
    resolved = true("ResolvedRefs", "ResolvedRefs", "listener object references resolved")
    if bad_kinds:
        names = ", ".join(f"{g}/{k}" for g, k in bad_kinds)
        resolved = false(
            "ResolvedRefs",
            "InvalidRouteKinds",
            f"listener {ls.name}: allowedRoutes.kinds names route kinds this controller does "
            f"not serve: {names}",
        )
    if st.conflict is not None:
        conds = (
            false("Accepted", "PortUnavailable", f"listener {ls.name}: {st.conflict}"),
            true("Conflicted", st.conflict_reason, f"listener {ls.name}: {st.conflict}"),
            resolved if bad_kinds else true("ResolvedRefs", "ResolvedRefs"),
            false("Programmed", "Invalid", left_out),
        )
        return ListenerStatus(ls.name, st.attached, conds, kinds)
    if st.tls_error is not None:
        conds = (
            true("Accepted", "Accepted", "listener accepted"),
            false("Conflicted", "NoConflicts"),
            false("ResolvedRefs", st.tls_reason, st.tls_error),
            false("Programmed", "Invalid", left_out),
        )
        return ListenerStatus(ls.name, 0, conds, kinds)
    conds = (
        true("Accepted", "Accepted", "listener accepted"),
        false("Conflicted", "NoConflicts"),
        resolved,
        true("Programmed", "Programmed", "listener is in the dataplane config"),
    )
    return ListenerStatus(ls.name, st.attached, conds, kinds)
