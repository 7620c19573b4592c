"""Long-term credential checks on TURN requests (RFC 8489 §9.2.4), apart from the state machine.

The `Gatekeeper` decides whether an Allocate, Refresh, CreatePermission or ChannelBind may proceed:
the auth type must not be `none`, the request must carry MESSAGE-INTEGRITY, USERNAME, REALM and a
nonce this listener minted and that has not gone stale, and the `Authenticator` policy must know
the user and the integrity must verify under its key. It works on the raw bytes with
`stunnerd.turn.precheck` (nothing is decoded for a request that fails), and answers with the
credential and the request's scan (which its decode reuses) or raises a `TurnError`; the engine
turns it into the error answer. A challenge (401, 438) carries REALM and a fresh NONCE, is not
cached (a retransmission gets a new nonce), and is sent only while the source IP has challenge
budget left (`stunnerd.turn.guard`).

Failed checks are budgeted per source and per username (`FailedAuthBudget`): over budget, the
credentials are not checked at all and the answer is 401 with the reason phrase
`THROTTLED_REASON`. RFC 8489 and RFC 8656 have no "too many requests" code, and 401 is the one
answer RFC 8489 §9.2.4 gives to credentials the server does not accept; 486 and 508 would tell a
client its allocation quota or the server's capacity is spent, which is not true and which
browsers treat as final. So a guesser keeps getting 401s that carry no verdict, a compliant
client gives up after its one retry (RFC 8489 §9.2.5), and the reason phrase (shown by browsers
as the ICE candidate error's text) and the log say why.
"""

from __future__ import annotations

from dataclasses import dataclass

from stunnerd.turn import codec, precheck
from stunnerd.turn.effects import Address
from stunnerd.turn.errors import BadRequestError, StaleNonceError, TurnError, UnauthorizedError
from stunnerd.turn.guard import FailedAuthBudget, RequestLimits, SourceBudget
from stunnerd.turn.policies import Authenticator, Credential, NonceMint


# Not frozen: one is built per request, and a frozen dataclass's __init__ costs about three
# times a plain one's (object.__setattr__ per field).
@dataclass(slots=True)
class AuthenticatedRequest:
    """A request that passed: the parsed message, the user and the key to sign answers with."""

    message: codec.Message
    client: Address
    user_id: str
    key: bytes
    peers: tuple[Address, ...]  # every XOR-PEER-ADDRESS, in order
    username: str = ""  # as sent; what a config change re-checks the allocation by


THROTTLED_REASON = "Unauthorized (too many failed authentications; retry later)"


class Gatekeeper:
    """One listener's nonces, its challenge and failed-authentication budgets, the check."""

    __slots__ = ("budget", "failures", "max_attributes", "nonces")

    def __init__(
        self,
        nonces: NonceMint,
        budget: SourceBudget,
        max_attributes: int,
        failures: FailedAuthBudget | None = None,
    ) -> None:
        self.nonces = nonces
        self.budget = budget
        self.max_attributes = max_attributes
        self.failures = failures if failures is not None else FailedAuthBudget(RequestLimits())

    def check(
        self,
        data: bytes,
        head: precheck.Header,
        now: float,
        unix_now: float,
        auth: Authenticator,
        client: Address = ("", 0),
    ) -> tuple[Credential, precheck.Scan]:
        """`now` is the engine's clock (nonces); `unix_now` the wall clock (TURN REST expiry).

        Raises `TurnError` for a request that may not proceed: 401 or 438 (a challenge; `detail`
        says why when credentials were given and are wrong, or were not checked because the
        source or the username spent its failure budget), 400 for a request without the
        credential attributes; `codec.StunBadRequestError` for one too malformed to judge.
        """
        if not auth.enabled:
            raise BadRequestError("TURN is disabled (auth type none)")
        at = precheck.integrity_offset(data)
        if at < 0:
            raise UnauthorizedError()  # the usual first request: nothing else is looked at
        found = precheck.scan(data, head, self.max_attributes)
        if found.integrity_at != at:
            raise UnauthorizedError()
        if found.username is None or found.nonce is None or found.realm is None:
            raise BadRequestError("Missing USERNAME, REALM or NONCE")
        if not self.nonces.valid(found.nonce, now):
            raise StaleNonceError()
        try:
            username = found.username.decode()
        except UnicodeDecodeError:
            raise BadRequestError("USERNAME is not UTF-8") from None
        spent = self.failures.refuses(client[0], username, now)
        if spent:
            why = (
                "too many failed authentications from this source"
                if spent == "source"
                else "too many failed authentications for this user, and this source failed too"
            )
            raise UnauthorizedError(
                THROTTLED_REASON,
                user=username,
                detail=f"{why}; credentials not checked",
                limit=f"auth_failures_{spent}",
            )
        credential = auth.lookup(username, unix_now)
        if credential is None:
            self.failures.failed(client[0], None, now)
            why = "no such user, or its TURN REST credentials expired"
            raise UnauthorizedError(user=username, detail=why)
        if not precheck.integrity_ok(data, at, credential.key):
            self.failures.failed(client[0], username, now)
            why = "wrong password (MESSAGE-INTEGRITY does not verify)"
            raise UnauthorizedError(user=username, detail=why)
        return credential, found

    def challenge(
        self, refused: TurnError, client: Address, now: float, auth: Authenticator
    ) -> TurnError | None:
        """The 401/438 to send, with REALM and a fresh NONCE; None when `client`'s IP has used
        up its challenge budget."""
        if not self.budget.allow(client[0], now):
            return None
        return self.challenge_error(refused, now, auth)

    def challenge_error(self, refused: TurnError, now: float, auth: Authenticator) -> TurnError:
        """The 401/438 to send for `refused`, with REALM and a NONCE issued at `now`, budget
        aside."""
        attributes = {"REALM": auth.realm, "NONCE": self.nonces.issue(now)}
        return TurnError(refused.code, refused.reason, attributes=attributes)
