"""Every STUN request a client sends, from its header to its answer (RFC 8489 §6.3, §9.2).

A retransmission gets the answer already given. Binding is answered to anyone. Every TURN method
goes through the `Gatekeeper` on the raw bytes first, is decoded only once its credentials are
proven, and then goes to its handler (`AllocationHandlers`, `TcpRelayHandlers`). A check that
refuses raises a `TurnError`, and this is where it is answered and logged:

* before authentication (an unknown method, a malformed request, the gate's 400): unsigned and
  not cached; the gate's refusals are logged unless they are the usual first challenge;
* a challenge (401, 438): REALM and a fresh NONCE, while the source has challenge budget left,
  else nothing (counted in `challenges_suppressed`, and as the `challenge_rate` limit);
* after authentication: logged (a 403 with the peer and the routes considered), signed with the
  user's key and cached for retransmissions. Unknown comprehension-required attributes (420) are
  the exception: unsigned, uncached, unlogged, as before authentication.
"""

from __future__ import annotations

from collections.abc import Callable

from stunnerd.turn import codec, precheck
from stunnerd.turn.allocation import unmapped_address
from stunnerd.turn.answers import Answerer
from stunnerd.turn.auth import AuthenticatedRequest, Gatekeeper
from stunnerd.turn.codec import Method
from stunnerd.turn.effects import Address, Effect, SendToClient
from stunnerd.turn.errors import (
    BadRequestError,
    TurnError,
    UnauthorizedError,
    UnknownAttributeError,
)
from stunnerd.turn.policies import Authenticator, Policies
from stunnerd.turn.refusals import RefusalLog, forbidden_detail, method_name

Handler = Callable[[AuthenticatedRequest, Policies, float, list[Effect]], None]
"""A TURN method: answers or raises `TurnError`; `now` is the engine's clock."""


class Dispatcher:
    """One listener's request path: the gate, the method handlers, the refusal log."""

    __slots__ = (
        "answers",
        "challenges_suppressed",
        "clock_offset_s",
        "gate",
        "handlers",
        "max_attributes",
        "refusals",
    )

    def __init__(
        self,
        answers: Answerer,
        gate: Gatekeeper,
        refusals: RefusalLog,
        handlers: dict[int, Handler],
        *,
        max_attributes: int,
        clock_offset_s: float,
    ) -> None:
        self.answers = answers
        self.gate = gate
        self.refusals = refusals
        self.handlers = handlers  # STUN method -> handler; every one needs credentials
        self.max_attributes = max_attributes
        self.clock_offset_s = clock_offset_s  # unix time = now + offset (TURN REST expiry)
        self.challenges_suppressed = 0  # 401/438 not sent: the source was over budget

    def handle(
        self,
        data: bytes,
        head: precheck.Header,
        client: Address,
        policies: Policies,
        now: float,
        out: list[Effect],
    ) -> None:
        """One request; raises `codec.StunDecodeError` for bytes to drop unanswered."""
        cached = self.answers.cached(client, head.transaction_id, now)
        if cached is not None:
            out.append(SendToClient(client, cached))
            return
        try:
            if head.method == Method.BINDING:
                self._binding(data, head, client, out)
            elif head.method in self.handlers:
                self._authenticated(data, head, client, policies, now, out)
            else:
                raise BadRequestError()
        except codec.StunBadRequestError as exc:
            if isinstance(exc, precheck.TooManyAttributesError):
                self.refusals.limited("attributes")
            self._refuse(out, client, head, BadRequestError(str(exc)))
        except TurnError as error:  # refused before authentication: not signed, not cached
            self._refuse(out, client, head, error)

    def _binding(
        self, data: bytes, head: precheck.Header, client: Address, out: list[Effect]
    ) -> None:
        """RFC 8489 §6.3.1: the one request anyone may make; its attributes are only scanned."""
        found = precheck.scan(data, head, self.max_attributes)
        if found.unknown_required:
            raise UnknownAttributeError(found.unknown_required)
        mapped = {"XOR-MAPPED-ADDRESS": unmapped_address(client)}
        self.answers.success(out, client, head.method, head.transaction_id, mapped)

    def _authenticated(
        self,
        data: bytes,
        head: precheck.Header,
        client: Address,
        policies: Policies,
        now: float,
        out: list[Effect],
    ) -> None:
        """Authenticate on the raw bytes (RFC 8489 §9.2.4), then decode (from the gate's scan,
        without a second walk) and dispatch."""
        auth = policies.authenticator
        try:
            credential, found = self.gate.check(
                data, head, now, now + self.clock_offset_s, auth, client
            )
        except TurnError as error:
            self._gate_refused(error, head, client, policies, now, out)
            return
        decoded = codec.decode_scanned(data, head.msg_type, head.transaction_id, found.spans)
        if decoded.unknown_required:
            # RFC 8489 §6.3.1: unknown comprehension-required attributes, after authentication
            raise UnknownAttributeError(decoded.unknown_required)
        request = AuthenticatedRequest(
            decoded.message,
            client,
            credential.user_id,
            credential.key,
            decoded.peers,
            credential.username,
        )
        try:
            self.handlers[head.method](request, policies, now, out)
        except TurnError as error:
            self._refused(request, error, policies, now, out)

    def _gate_refused(
        self,
        error: TurnError,
        head: precheck.Header,
        client: Address,
        policies: Policies,
        now: float,
        out: list[Effect],
    ) -> None:
        """A request the gate stopped: logged unless it is the usual challenge; 401 and 438
        answered with a fresh nonce while the source has challenge budget left."""
        if error.detail or not error.challenge:
            self.refusals.refused(
                now,
                client,
                method_name(head.method),
                error.code,
                error.reason,
                error.user,
                error.detail,
                error.limit,
            )
        elif error.limit:
            self.refusals.limited(error.limit)
        if error.challenge:
            challenge = self.gate.challenge(error, client, now, policies.authenticator)
            if challenge is None:
                self.challenges_suppressed += 1
                self.refusals.limited("challenge_rate")
                return
            error = challenge
        self._refuse(out, client, head, error)

    def challenge_template(self, method: int, auth: Authenticator, now: float) -> bytes | None:
        """The 401 this path answers a `method` request without MESSAGE-INTEGRITY with, its
        nonce issued at `now` and its transaction id zeroed: what the C relay sends in its place
        (`stunnerd.fastpath.FastPath.answer_challenges`). None when TURN is off (such a request
        gets 400)."""
        if not auth.enabled:
            return None
        error = self.gate.challenge_error(UnauthorizedError(), now, auth)
        return self.answers.error_bytes(method, bytes(12), error)

    def suppressed_elsewhere(self, count: int) -> None:
        """Challenges the C relay did not send for this listener: their source was over budget."""
        self.challenges_suppressed += count
        self.refusals.limited("challenge_rate", count)

    def _refuse(
        self, out: list[Effect], client: Address, head: precheck.Header, error: TurnError
    ) -> None:
        """A short error answer to a request refused before authentication; not cached."""
        self.answers.error(out, client, head.method, head.transaction_id, error)

    def _refused(
        self,
        req: AuthenticatedRequest,
        error: TurnError,
        policies: Policies,
        now: float,
        out: list[Effect],
    ) -> None:
        """Every error answer to an authenticated request: logged (rate-limited), counted,
        signed and cached."""
        msg = req.message
        detail = forbidden_detail(policies.peers, req.peers) if error.code == 403 else ""
        self.refusals.refused(
            now,
            req.client,
            method_name(msg.message_method),
            error.code,
            error.reason,
            req.username or req.user_id,
            detail,
            error.limit,
        )
        self.answers.error(
            out, req.client, msg.message_method, msg.transaction_id, error, key=req.key, now=now
        )
