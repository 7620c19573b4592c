"""The GatewayClass → GatewayConfig → Dataplane hierarchy a Gateway of ours must resolve.

A GatewayClass of our controller names a GatewayConfig (realm checked here), which
names a Dataplane. `resolve_hierarchy` says what resolved or why not, and `class_status` turns that
into the GatewayClass's status. Kept apart from ``gateway.py`` because the render engine also
uses it on its own, for every GatewayClass's status; ``gateway.py`` re-exports both names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stunner_common.crds import STUNNER_GROUP, Dataplane, GatewayClass, GatewayConfig
from stunner_operator.render.options import RenderOptions
from stunner_operator.render.status import SUPPORTED_FEATURES, GatewayClassStatus, false, true
from stunner_operator.render.store import View

_REALM_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """A GatewayClass of ours and what it resolves to; ``error`` invalidates all its Gateways."""

    gwclass: GatewayClass
    gwconfig: GatewayConfig | None
    dataplane: Dataplane | None
    error: str | None


def resolve_hierarchy(view: View, class_name: str, options: RenderOptions) -> Hierarchy | None:
    """None when the class does not exist or belongs to another controller."""
    gwclass = view.get(GatewayClass, "", class_name)
    if gwclass is None or gwclass.spec.controller_name != options.controller_name:
        return None
    ref = gwclass.spec.parameters_ref
    if ref is None:
        return Hierarchy(
            gwclass, None, None, "spec.parametersRef is missing: point it at a GatewayConfig"
        )
    if (ref.group or STUNNER_GROUP) != STUNNER_GROUP or (ref.kind or "GatewayConfig") != (
        "GatewayConfig"
    ):
        return Hierarchy(
            gwclass,
            None,
            None,
            f"spec.parametersRef must reference a {STUNNER_GROUP} GatewayConfig, "
            f"not group {ref.group!r} kind {ref.kind!r}",
        )
    if not ref.name or not ref.namespace:
        return Hierarchy(gwclass, None, None, "spec.parametersRef needs both name and namespace")
    gwconfig = view.get(GatewayConfig, ref.namespace, ref.name)
    if gwconfig is None:
        return Hierarchy(gwclass, None, None, f"GatewayConfig {ref.namespace}/{ref.name} not found")
    if not _REALM_RE.match(gwconfig.spec.realm):
        return Hierarchy(
            gwclass,
            gwconfig,
            None,
            f"GatewayConfig {ref.namespace}/{ref.name}: invalid realm {gwconfig.spec.realm!r} "
            "(lower-case alphanumerics, '-' and '.')",
        )
    dp_name = gwconfig.spec.dataplane or "default"
    dataplane = view.get(Dataplane, "", dp_name)
    if dataplane is None:
        return Hierarchy(
            gwclass,
            gwconfig,
            None,
            f"Dataplane {dp_name!r} not found (named by GatewayConfig {ref.namespace}/{ref.name})",
        )
    return Hierarchy(gwclass, gwconfig, dataplane, None)


def class_status(h: Hierarchy, options: RenderOptions) -> GatewayClassStatus:
    ctl = options.controller_name
    if h.error is None:
        cond = true("Accepted", "Accepted", f'GatewayClass is now managed by controller "{ctl}"')
    else:
        cond = false(
            "Accepted",
            "InvalidParameters",
            f'controller "{ctl}" failed to process GatewayClass: {h.error}',
        )
    return GatewayClassStatus(h.gwclass.metadata.generation, (cond,), supported_features(options))


def supported_features(options: RenderOptions) -> tuple[str, ...]:
    """What the class's ``status.supportedFeatures`` claims (GEP-2162), sorted by name."""
    extra = ("ReferenceGrant",) if options.enforce_reference_grants else ()
    return tuple(sorted((*SUPPORTED_FEATURES, *extra)))
