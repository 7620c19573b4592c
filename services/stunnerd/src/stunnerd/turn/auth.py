"""Long-term credential checks on TURN requests (RFC 8489 §9.2.4), apart from the state machine.

The `Gatekeeper` decides whether an Allocate, Refresh, CreatePermission or ChannelBind may proceed:
the auth type must not be `none`, the request must carry MESSAGE-INTEGRITY, USERNAME, REALM and a
nonce this listener minted and that has not gone stale, and the `Authenticator` policy must know
the user and the integrity must verify under its key. It works on the raw bytes with
`stunnerd.turn.precheck` (nothing is decoded for a request that fails), and answers with the
credential or a `Refusal`; the engine turns a refusal into the error answer. A challenge (401,
438) carries REALM and a fresh NONCE, is not cached (a retransmission gets a new nonce), and is
sent only while the source IP has challenge budget left (`stunnerd.turn.guard`).
"""

from __future__ import annotations

from dataclasses import dataclass

from stunnerd.turn import codec, precheck
from stunnerd.turn.effects import Address
from stunnerd.turn.guard import ChallengeBudget
from stunnerd.turn.policies import Authenticator, Credential, NonceMint


@dataclass(frozen=True, slots=True)
class AuthenticatedRequest:
    """A request that passed: the parsed message, the user and the key to sign answers with."""

    message: codec.Message
    client: Address
    user_id: str
    key: bytes
    peers: tuple[Address, ...]  # every XOR-PEER-ADDRESS, in order
    username: str = ""  # as sent; what a config change re-checks the allocation by


@dataclass(frozen=True, slots=True)
class Refusal:
    code: int
    reason: str
    challenge: bool
    """Answer with REALM and a fresh NONCE (401, 438) rather than a plain error."""
    user: str = ""
    """The USERNAME the request carried, when it got that far."""
    detail: str = ""
    """Why, for the log: set when credentials were given and are wrong (not for the usual first
    request without credentials, or a stale nonce)."""


UNAUTHORIZED = Refusal(401, "Unauthorized", challenge=True)
STALE_NONCE = Refusal(438, "Stale Nonce", challenge=True)


class Gatekeeper:
    """One listener's nonces, its challenge budget and the credential check."""

    __slots__ = ("budget", "max_attributes", "nonces")

    def __init__(self, nonces: NonceMint, budget: ChallengeBudget, max_attributes: int) -> None:
        self.nonces = nonces
        self.budget = budget
        self.max_attributes = max_attributes

    def check(
        self,
        data: bytes,
        head: precheck.Header,
        now: float,
        unix_now: float,
        auth: Authenticator,
    ) -> Credential | Refusal:
        """`now` is the engine's clock (nonces); `unix_now` the wall clock (TURN REST expiry).

        Raises `codec.StunBadRequestError` for a request too malformed to judge (answer 400).
        """
        if not auth.enabled:
            return Refusal(400, "TURN is disabled (auth type none)", challenge=False)
        at = precheck.integrity_offset(data)
        if at < 0:
            return UNAUTHORIZED  # the usual first request: nothing else is looked at
        found = precheck.scan(data, head, self.max_attributes)
        if found.integrity_at != at:
            return UNAUTHORIZED
        if found.username is None or found.nonce is None or found.realm is None:
            return Refusal(400, "Missing USERNAME, REALM or NONCE", challenge=False)
        if not self.nonces.valid(found.nonce, now):
            return STALE_NONCE
        try:
            username = found.username.decode()
        except UnicodeDecodeError:
            return Refusal(400, "USERNAME is not UTF-8", challenge=False)
        credential = auth.lookup(username, unix_now)
        if credential is None:
            why = "no such user, or its TURN REST credentials expired"
            return Refusal(401, "Unauthorized", challenge=True, user=username, detail=why)
        if not precheck.integrity_ok(data, at, credential.key):
            why = "wrong password (MESSAGE-INTEGRITY does not verify)"
            return Refusal(401, "Unauthorized", challenge=True, user=username, detail=why)
        return credential

    def challenge(
        self,
        head: precheck.Header,
        refusal: Refusal,
        client: Address,
        now: float,
        auth: Authenticator,
        software: str | None,
    ) -> bytes | None:
        """The 401/438 answer, or None when `client`'s IP has used up its challenge budget."""
        if not self.budget.allow(client[0], now):
            return None
        return codec.error_response(
            head.method,
            head.transaction_id,
            refusal.code,
            refusal.reason,
            extra={"REALM": auth.realm, "NONCE": self.nonces.issue(now)},
            software=software,
        )
