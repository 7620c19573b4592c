"""Bearer tokens (RFC 6750) as the CDS and the auth service check them.

Both APIs take an optional token and compare what a client offers in ``Authorization`` with it in
constant time; one function keeps the two servers' rule the same (scheme case-insensitive,
surrounding blanks ignored).
"""

from __future__ import annotations

import hmac

__all__ = ["bearer_matches"]


def bearer_matches(authorization: str, token: bytes) -> bool:
    """True when the ``Authorization`` header value carries ``Bearer <token>``."""
    scheme, _, offered = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(offered.strip().encode(), token)
