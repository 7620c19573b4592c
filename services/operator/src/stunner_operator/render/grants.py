"""Whether a cross-namespace reference is permitted: Gateway API ReferenceGrants (GEP-709).

Upstream STUNner routes across namespaces without asking for a ReferenceGrant, and so does this
operator by default. With ``RenderOptions.enforce_reference_grants`` (``--enforce-reference-grants``
/ ``OPERATOR_ENFORCE_REFERENCE_GRANTS=true``) a UDPRoute's backendRef into another namespace, and
a Gateway listener's certificateRef to a Secret in another namespace, must be allowed by a
ReferenceGrant in the target namespace; otherwise the reference is treated as unresolved with
reason ``RefNotPermitted``. Same-namespace references never need a grant.
"""

from __future__ import annotations

from dataclasses import dataclass

from stunner_operator.render.options import RenderOptions
from stunner_operator.render.store import View


@dataclass(frozen=True, slots=True)
class Reference:
    """A reference from an object of (group, kind) in ``from_ns`` to ``to_ns``/``to_name``."""

    from_group: str
    from_kind: str
    from_ns: str
    to_group: str
    to_kind: str
    to_ns: str
    to_name: str


def reference_permitted(view: View, ref: Reference, options: RenderOptions) -> bool:
    if ref.from_ns == ref.to_ns or not options.enforce_reference_grants:
        return True
    for grant in view.grants_in(ref.to_ns):
        sources = any(
            f.group == ref.from_group and f.kind == ref.from_kind and f.namespace == ref.from_ns
            for f in grant.spec.from_
        )
        if sources and any(
            t.group == ref.to_group
            and t.kind == ref.to_kind
            and (t.name or ref.to_name) == ref.to_name
            for t in grant.spec.to
        ):
            return True
    return False


def not_permitted_message(ref: Reference) -> str:
    what = f"{ref.to_kind} {ref.to_ns}/{ref.to_name}"
    return (
        f"{what} is in another namespace and no ReferenceGrant in {ref.to_ns} allows "
        f"{ref.from_kind}s of {ref.from_ns} to reference it"
    )
