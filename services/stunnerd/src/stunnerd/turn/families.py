"""Which relay address families an Allocate gets: RFC 8656 §7.2 on the two family attributes.

A listener has a relay address in one family (its `address`) and possibly one in the other
(`STUNNERD_RELAY_ADDRESSES`). REQUESTED-ADDRESS-FAMILY asks for one family; without it the
allocation takes the listener's own family (upstream's rule; RFC 8656 would pick IPv4).
ADDITIONAL-ADDRESS-FAMILY (value IPv6) asks for a *dual* allocation: an IPv4 and an IPv6 relay
under one allocation, one lifetime, and permissions per family.

Refusals, in the order the RFC checks them: both attributes together, ADDITIONAL-ADDRESS-FAMILY
with a value other than IPv6, or with RESERVATION-TOKEN or EVEN-PORT's R bit (a reserved port
names one socket; coturn refuses the R bit the same way) get 400 (a plain EVEN-PORT makes the IPv4
relay's port even); a family the listener has no relay
address for gets 440. A dual request to a listener without an IPv6 relay address still gets its
IPv4 relay, with ADDRESS-ERROR-CODE 440 for the IPv6 part (RFC 8656 §7.2); without an IPv4 relay
address the whole request gets 440.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from stunnerd.turn.errors import AddressFamilyNotSupportedError, BadRequestError

FAMILY_CODES = {0x01: 4, 0x02: 6}
"""REQUESTED-/ADDITIONAL-ADDRESS-FAMILY values (RFC 8656 §18.11) → IP version."""


@dataclass(frozen=True, slots=True)
class FamilyChoice:
    family: int  # the allocation's first relay: 4 or 6
    additional: int = 0  # 6 when a dual allocation also gets an IPv6 relay
    refused: int = 0  # 6 when a dual allocation cannot get its IPv6 relay (ADDRESS-ERROR-CODE)


def choose_families(
    attrs: Mapping[str, Any], relay_families: Collection[int], own_family: int
) -> FamilyChoice:
    """The relay families for an Allocate with `attrs`, given the families the listener serves.

    Raises `BadRequestError` or `AddressFamilyNotSupportedError`.
    """
    requested = attrs.get("REQUESTED-ADDRESS-FAMILY")
    additional = attrs.get("ADDITIONAL-ADDRESS-FAMILY")
    if additional is not None:
        if requested is not None:
            raise BadRequestError("REQUESTED-ADDRESS-FAMILY with ADDITIONAL-ADDRESS-FAMILY")
        if "RESERVATION-TOKEN" in attrs:
            raise BadRequestError("RESERVATION-TOKEN with ADDITIONAL-ADDRESS-FAMILY")
        if attrs.get("EVEN-PORT", 0) & 0x80:
            raise BadRequestError("EVEN-PORT with R bit and ADDITIONAL-ADDRESS-FAMILY")
        if FAMILY_CODES.get(additional) != 6:
            raise BadRequestError("ADDITIONAL-ADDRESS-FAMILY must be IPv6")
        if 4 not in relay_families:
            raise AddressFamilyNotSupportedError()
        if 6 not in relay_families:
            return FamilyChoice(4, refused=6)
        return FamilyChoice(4, additional=6)
    if requested is not None:
        if "RESERVATION-TOKEN" in attrs:
            raise BadRequestError("RESERVATION-TOKEN with REQUESTED-ADDRESS-FAMILY")
        wanted = FAMILY_CODES.get(requested)
        if wanted is None or wanted not in relay_families:
            raise AddressFamilyNotSupportedError()
        return FamilyChoice(wanted)
    return FamilyChoice(own_family)
