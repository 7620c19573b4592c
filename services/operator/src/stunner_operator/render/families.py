"""IP families of a Gateway's Service and dataplane: dual-stack Gateways (IPv4 and IPv6).

Upstream STUNner renders single-stack Services only (a request for `ipFamilyPolicy` is open
upstream, l7mp/stunner#196), so the knobs are ours, in upstream's annotation style, read like
the other `stunner.l7mp.io/*` annotations (GatewayConfig LB annotations, overridden by the
Gateway's):

* `stunner.l7mp.io/ip-family-policy`: `SingleStack`, `PreferDualStack` or `RequireDualStack`,
  the Service's `spec.ipFamilyPolicy`;
* `stunner.l7mp.io/ip-families`: `IPv4`, `IPv6`, `IPv4,IPv6` or `IPv6,IPv4`, its `spec.ipFamilies`
  (the first is the primary family).

Without them, a Gateway whose `spec.addresses` hold IP addresses of both families is dual-stack
(`RequireDualStack`, families in the order of the addresses); otherwise the cluster's defaults
apply (nothing is rendered). A dual-stack Gateway's dataplane binds `::` (both families) and
gets `STUNNERD_RELAY_ADDRESSES` from the pod's `status.podIPs`, so that it has a relay address
in each family (dual allocations, RFC 8656 §7.2).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from stunner_common.crds import Gateway

IP_FAMILY_POLICY = "stunner.l7mp.io/ip-family-policy"
IP_FAMILIES = "stunner.l7mp.io/ip-families"
POLICIES = ("SingleStack", "PreferDualStack", "RequireDualStack")
FAMILIES = ("IPv4", "IPv6")


@dataclass(frozen=True, slots=True)
class IpFamilies:
    """What the Service gets (None/empty: left to the cluster) and whether it is dual-stack."""

    policy: str | None = None
    families: tuple[str, ...] = ()

    @property
    def dual_stack(self) -> bool:
        return self.policy in ("PreferDualStack", "RequireDualStack") or len(self.families) > 1


def address_family(value: str) -> str | None:
    try:
        return "IPv6" if ipaddress.ip_address(value).version == 6 else "IPv4"
    except ValueError:
        return None


def hinted_ips(gw: Gateway) -> list[str]:
    """The Gateway's IP address hints (`spec.addresses` of type IPAddress), in order."""
    return [
        a.value for a in gw.spec.addresses if (a.type or "IPAddress") == "IPAddress" and a.value
    ]


def hinted_families(gw: Gateway) -> tuple[str, ...]:
    out: list[str] = []
    for ip in hinted_ips(gw):
        family = address_family(ip)
        if family is not None and family not in out:
            out.append(family)
    return tuple(out)


def _policy(annotations: dict[str, str]) -> tuple[str | None, list[str]]:
    raw = annotations.get(IP_FAMILY_POLICY)
    if raw is None:
        return None, []
    match = next((p for p in POLICIES if p.lower() == raw.strip().lower()), None)
    if match is None:
        return None, [
            f"annotation {IP_FAMILY_POLICY}: {raw!r} is not one of {', '.join(POLICIES)}; ignored"
        ]
    return match, []


def _families(annotations: dict[str, str]) -> tuple[tuple[str, ...], list[str]]:
    raw = annotations.get(IP_FAMILIES)
    if raw is None:
        return (), []
    out: list[str] = []
    for item in raw.split(","):
        match = next((f for f in FAMILIES if f.lower() == item.strip().lower()), None)
        if match is None or match in out:
            return (), [
                f"annotation {IP_FAMILIES}: {raw!r} is not IPv4, IPv6 or both, each once; ignored"
            ]
        out.append(match)
    return tuple(out), []


def ip_families(gw: Gateway, annotations: dict[str, str]) -> IpFamilies:
    policy, _ = _policy(annotations)
    families, _ = _families(annotations)
    if policy is None and not families:
        hinted = hinted_families(gw)
        if len(hinted) > 1:
            return IpFamilies("RequireDualStack", hinted)
        return IpFamilies()
    if policy == "SingleStack":
        families = families[:1]
    elif policy is None and len(families) > 1:
        policy = "RequireDualStack"  # two families need a dual-stack policy
    return IpFamilies(policy, families)


def ip_family_problems(annotations: dict[str, str]) -> list[str]:
    problems = _policy(annotations)[1] + _families(annotations)[1]
    policy, families = _policy(annotations)[0], _families(annotations)[0]
    if policy == "SingleStack" and len(families) > 1:
        problems.append(
            f"annotation {IP_FAMILIES}: SingleStack takes one family; using {families[0]}"
        )
    return problems


def dual_stack_env() -> list[dict[str, object]]:
    """What a dual-stack Gateway's stunnerd needs: both families on its sockets, and a relay
    address per family (`status.podIPs` is the pod's comma-separated addresses)."""
    return [
        {"name": "STUNNERD_BIND_HOST", "value": "::"},
        {
            "name": "STUNNERD_RELAY_ADDRESSES",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}},
        },
    ]
