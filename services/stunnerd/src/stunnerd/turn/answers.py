"""The one way an answer reaches a TURN client: encode, remember for retransmits, send.

Every response the engine sends, success or `TurnError`, goes through `Answerer.success` or
`Answerer.error`, whether it answers at once or later (an Allocate once the edge opened its
relay, a Connect once the peer answered). An answer given with `now` is remembered in the
retransmission cache (RFC 8489 §6.3.1): a retransmitted request gets the same bytes, even after
the request changed state (a Refresh that deleted the allocation). Answers given without `now`
are not: a challenge carries a fresh nonce each time and a refusal before authentication costs
nothing to work out again. With `key`, the answer carries MESSAGE-INTEGRITY (RFC 8489 §9.2.4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stunnerd.turn import codec
from stunnerd.turn.codec import Class
from stunnerd.turn.effects import Address, Effect, SendToClient
from stunnerd.turn.errors import TurnError
from stunnerd.turn.retransmit import RetransmitCache

Attributes = Mapping[str, Any] | Sequence[tuple[str, Any]]


class Answerer:
    """One listener's answers: the SOFTWARE it signs with, its cache, its indication ids."""

    __slots__ = ("_indications", "cache", "software")

    def __init__(self, software: str | None) -> None:
        self.software = software
        self.cache = RetransmitCache()
        self._indications = 0

    def cached(self, client: Address, transaction_id: bytes, now: float) -> bytes | None:
        """The answer already given to this request, if it is a retransmission."""
        return self.cache.get(client, transaction_id, now)

    def success(
        self,
        out: list[Effect],
        client: Address,
        method: int,
        transaction_id: bytes,
        attributes: Attributes,
        *,
        key: bytes | None = None,
        now: float | None = None,
    ) -> None:
        answer = codec.encode(
            method,
            Class.RESPONSE,
            transaction_id,
            attributes,
            key=key,
            software=self.software,
        )
        self._send(out, client, transaction_id, answer, now)

    def error(
        self,
        out: list[Effect],
        client: Address,
        method: int,
        transaction_id: bytes,
        error: TurnError,
        *,
        key: bytes | None = None,
        now: float | None = None,
    ) -> None:
        answer = self.error_bytes(method, transaction_id, error, key=key)
        self._send(out, client, transaction_id, answer, now)

    def error_bytes(
        self, method: int, transaction_id: bytes, error: TurnError, *, key: bytes | None = None
    ) -> bytes:
        """The error answer as `error` sends it, encoded."""
        return codec.error_response(
            method,
            transaction_id,
            error.code,
            error.reason,
            extra=error.attributes,
            key=key,
            software=self.software,
        )

    def indication(
        self, out: list[Effect], client: Address, method: int, attributes: Attributes
    ) -> None:
        """An indication to the client (ConnectionAttempt): never cached, never signed."""
        answer = codec.encode(
            method, Class.INDICATION, self.next_id(), attributes, software=self.software
        )
        out.append(SendToClient(client, answer))

    def next_id(self) -> bytes:
        """Indications need a transaction id; uniqueness is all that matters (RFC 8489 §6)."""
        self._indications += 1
        return self._indications.to_bytes(12, "big")

    def _send(
        self,
        out: list[Effect],
        client: Address,
        transaction_id: bytes,
        answer: bytes,
        now: float | None,
    ) -> None:
        if now is not None:
            self.cache.remember(client, transaction_id, answer, now)
        out.append(SendToClient(client, answer))
