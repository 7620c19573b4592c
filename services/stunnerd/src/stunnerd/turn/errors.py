"""Why the engine refuses a TURN request: one exception per STUN error code it answers.

Every check that refuses a request raises a `TurnError`; the engine catches it where it
dispatched the request and turns it into the error answer (`answers.Answerer.error`), signed and
remembered for retransmissions once the request is authenticated. So a handler reads as its RFC
section: check, raise, or carry on. The codes (RFC 8489 §14.8, RFC 8656 §19, RFC 6062 §6.3)::

    TurnError(code, reason)
    └── CodedError: the code fixed, the reason defaulting to the RFC's phrase
        ├── BadRequestError                 400
        ├── UnauthorizedError               401  challenge: REALM and a fresh NONCE
        ├── ForbiddenError                  403
        ├── UnknownAttributeError           420  with UNKNOWN-ATTRIBUTES
        ├── AllocationMismatchError         437
        ├── StaleNonceError                 438  challenge: REALM and a fresh NONCE
        ├── AddressFamilyNotSupportedError  440
        ├── WrongCredentialsError           441
        ├── UnsupportedTransportError       442
        ├── PeerAddressFamilyMismatchError  443
        ├── ConnectionAlreadyExistsError    446
        ├── ConnectionFailureError          447
        ├── AllocationQuotaReachedError     486
        └── InsufficientCapacityError       508

Malformed bytes are not `TurnError`s: the codec raises `StunDecodeError` (dropped) or
`StunBadRequestError` (mapped to a 400 at the engine's boundary).
"""

from __future__ import annotations

from typing import Any, ClassVar


class TurnError(Exception):
    """A refusal: the STUN error `code` and `reason` phrase the client gets.

    `attributes` are sent along (UNKNOWN-ATTRIBUTES, a challenge's REALM and NONCE); `user` and
    `detail` are only for the refusal log (who asked, and why it failed when that is not the
    usual first request without credentials); `limit` names the limit that refused it (one of
    `stunnerd.turn.refusals.LIMITS`), counted beside the code.
    """

    challenge: ClassVar[bool] = False
    """Answered with REALM and a fresh NONCE (401, 438), within the source's challenge budget."""

    def __init__(
        self,
        code: int,
        reason: str,
        *,
        attributes: dict[str, Any] | None = None,
        user: str = "",
        detail: str = "",
        limit: str = "",
    ) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason
        self.attributes = attributes
        self.user = user
        self.detail = detail
        self.limit = limit

    def __str__(self) -> str:
        return f"{self.code} {self.reason}"


class CodedError(TurnError):
    """The base of the errors below: each names its code and the RFC's reason phrase."""

    CODE: ClassVar[int]
    REASON: ClassVar[str]

    def __init__(
        self,
        reason: str = "",
        *,
        attributes: dict[str, Any] | None = None,
        user: str = "",
        detail: str = "",
        limit: str = "",
    ) -> None:
        super().__init__(
            self.CODE,
            reason or self.REASON,
            attributes=attributes,
            user=user,
            detail=detail,
            limit=limit,
        )


class BadRequestError(CodedError):
    """A malformed or contradictory request (RFC 8489 §14.8), named in the reason."""

    CODE, REASON = 400, "Bad Request"


class UnauthorizedError(CodedError):
    """No or wrong credentials (RFC 8489 §9.2.4): the client is challenged."""

    CODE, REASON = 401, "Unauthorized"
    challenge = True


class ForbiddenError(CodedError):
    """A peer no route admits: CreatePermission, ChannelBind, Connect."""

    CODE, REASON = 403, "Forbidden (peer not admitted by any route)"


class UnknownAttributeError(CodedError):
    """RFC 8489 §6.3.1: comprehension-required attributes this server does not know."""

    CODE, REASON = 420, "Unknown Attribute"

    def __init__(self, types: tuple[int, ...]) -> None:
        super().__init__(attributes={"UNKNOWN-ATTRIBUTES": types})


class AllocationMismatchError(CodedError):
    """An Allocate where one exists, or a request without one (RFC 8656 §7.2)."""

    CODE, REASON = 437, "Allocation Mismatch"


class StaleNonceError(CodedError):
    """A nonce this listener did not mint or that has expired (RFC 8489 §9.2.4)."""

    CODE, REASON = 438, "Stale Nonce"
    challenge = True


class AddressFamilyNotSupportedError(CodedError):
    """A relay family the listener has no address for (RFC 8656 §7.2)."""

    CODE, REASON = 440, "Address Family not Supported"


class WrongCredentialsError(CodedError):
    """A ConnectionBind by another user than the allocation's (RFC 6062 §5.4)."""

    CODE, REASON = 441, "Wrong Credentials"


class UnsupportedTransportError(CodedError):
    """A relay transport this listener cannot serve (RFC 8656 §7.2)."""

    CODE, REASON = 442, "Unsupported Transport Protocol"


class PeerAddressFamilyMismatchError(CodedError):
    """A peer of a family the allocation has no relay for (RFC 8656 §9)."""

    CODE, REASON = 443, "Peer Address Family Mismatch"


class ConnectionAlreadyExistsError(CodedError):
    """A second Connect to the same peer (RFC 6062 §5.2)."""

    CODE, REASON = 446, "Connection Already Exists"


class ConnectionFailureError(CodedError):
    """The peer could not be reached in time (RFC 6062 §5.2)."""

    CODE, REASON = 447, "Connection Timeout or Failure"


class AllocationQuotaReachedError(CodedError):
    """The user holds its quota of allocations."""

    CODE, REASON = 486, "Allocation Quota Reached"


class InsufficientCapacityError(CodedError):
    """No relay socket, no such reservation, too many peer connections."""

    CODE, REASON = 508, "Insufficient Capacity"
