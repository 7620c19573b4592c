"""Long-term credential checks on TURN requests (RFC 8489 §9.2.4), apart from the state machine.

The `Gatekeeper` decides whether an Allocate, Refresh, CreatePermission or ChannelBind may proceed:
the auth type must not be `none`, the request must carry MESSAGE-INTEGRITY, USERNAME, REALM and a
nonce this listener minted and that has not gone stale, and the `Authenticator` policy must know
the user and the integrity must verify under its key. It answers with the authenticated request
or a `Refusal`; the engine turns a refusal into the error answer (a challenge carries REALM and a
fresh NONCE and is not cached, so a retransmission gets a new nonce).
"""

from __future__ import annotations

from dataclasses import dataclass

from stunnerd.turn import codec
from stunnerd.turn.effects import Address
from stunnerd.turn.policies import Authenticator, NonceMint


@dataclass(frozen=True, slots=True)
class AuthenticatedRequest:
    """A request that passed: the parsed message, the user and the key to sign answers with."""

    message: codec.Message
    client: Address
    user_id: str
    key: bytes
    peers: tuple[Address, ...]  # every XOR-PEER-ADDRESS, in order


@dataclass(frozen=True, slots=True)
class Refusal:
    code: int
    reason: str
    challenge: bool
    """Answer with REALM and a fresh NONCE (401, 438) rather than a plain error."""


class Gatekeeper:
    """One listener's nonces and the credential check."""

    __slots__ = ("nonces",)

    def __init__(self, nonces: NonceMint) -> None:
        self.nonces = nonces

    def check(
        self,
        decoded: codec.Decoded,
        client: Address,
        now: float,
        unix_now: float,
        auth: Authenticator,
    ) -> AuthenticatedRequest | Refusal:
        """`now` is the engine's clock (nonces); `unix_now` the wall clock (TURN REST expiry)."""
        msg = decoded.message
        if not auth.enabled:
            return Refusal(400, "TURN is disabled (auth type none)", challenge=False)
        attrs = msg.attributes
        if "MESSAGE-INTEGRITY" not in attrs:
            return Refusal(401, "Unauthorized", challenge=True)
        username = attrs.get("USERNAME")
        nonce = attrs.get("NONCE")
        if username is None or nonce is None or "REALM" not in attrs:
            return Refusal(400, "Missing USERNAME, REALM or NONCE", challenge=False)
        if not self.nonces.valid(nonce, now):
            return Refusal(438, "Stale Nonce", challenge=True)
        credential = auth.lookup(username, unix_now)
        if credential is None or not codec.check_integrity(msg, credential.key):
            return Refusal(401, "Unauthorized", challenge=True)
        return AuthenticatedRequest(msg, client, credential.user_id, credential.key, decoded.peers)

    def challenge(
        self,
        msg: codec.Message,
        refusal: Refusal,
        now: float,
        auth: Authenticator,
        software: str | None,
    ) -> bytes:
        return codec.error_response(
            msg.message_method,
            msg.transaction_id,
            refusal.code,
            refusal.reason,
            extra={"REALM": auth.realm, "NONCE": self.nonces.issue(now)},
            software=software,
        )
