"""STUN transactions of a TURN client: requests, their answers and long-term authentication.

A `Transactions` sends a request over the session's `Carrier` and waits for the answer with the
same transaction id, retransmitting on UDP (RFC 8489 §6.2.1), or runs one exchange on an RFC 6062
data connection. `request()` adds long-term credentials (RFC 8489 §9.2): the first request goes
unsigned, the 401 brings the realm and nonce, every later request is signed; a 438 brings a fresh
nonce and a retry; a 401 to a signed request means the credentials are wrong. Any other error
answer is turned into an error by the caller's `Refused`, which knows what the request was about.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from stunner_common.framing import stream_frame_length
from stunner_common.stun import HEADER_LENGTH, Class, Message, Method
from turncat.carrier import Carrier
from turncat.errors import AuthFailedError, TurncatError, TurnError, UnreachableError
from turncat.settings import TurncatSettings
from turncat.wire import LongTermAuth, build_request, error_of, integrity_ok, parse_stun

Credentials = tuple[str, str]
Exchange = Callable[[Message], Awaitable[Message]]
Refused = Callable[[Method, int, str], TurncatError]
"""Makes the error for an error answer that authentication does not handle."""

MAX_AUTH_ROUNDS = 4


class Transactions:
    """The requests in flight on one connection to a TURN server, and its credentials."""

    def __init__(self, server: tuple[str, int], settings: TurncatSettings) -> None:
        self._server = server
        self._settings = settings
        self._pending: dict[bytes, asyncio.Future[Message]] = {}
        self.carrier: Carrier | None = None
        self.credentials: Credentials | None = None
        self.auth: LongTermAuth | None = None
        self.lost = False
        """The connection is gone (or the session gave up on it): nothing more is sent."""

    def answer_received(self, msg: Message) -> None:
        """A response or error response: it completes the request with its transaction id."""
        fut = self._pending.get(msg.transaction_id)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def fail_pending(self, exc: Exception) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)

    def _no_answer(self, method: str) -> UnreachableError:
        return UnreachableError(
            f"TURN server {self._server[0]}:{self._server[1]} did not answer {method} "
            f"within {self._settings.request_timeout_s:g} s"
        )

    async def exchange(self, msg: Message) -> Message:
        """Send a request and wait for its answer, retransmitting on UDP (RFC 8489 §6.2.1)."""
        carrier = self.carrier
        if carrier is None or self.lost:
            raise UnreachableError(f"no connection to TURN server {self._server[0]}")
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[msg.transaction_id] = fut
        data = bytes(msg)
        try:
            async with asyncio.timeout(self._settings.request_timeout_s):
                rto = self._settings.initial_rto_s
                while True:
                    carrier.send(data)
                    if carrier.reliable:
                        return await fut
                    done, _ = await asyncio.wait({fut}, timeout=rto)
                    if done:
                        return fut.result()
                    rto *= 2
        except TimeoutError:
            raise self._no_answer(msg.method_name) from None
        finally:
            self._pending.pop(msg.transaction_id, None)
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # mark retrieved

    async def stream_exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, msg: Message
    ) -> Message:
        """One transaction on a data connection: nothing but STUN flows on it until the
        ConnectionBind success response (RFC 6062 §4.3), so the answer is the next message."""
        method = msg.method_name
        try:
            async with asyncio.timeout(self._settings.request_timeout_s):
                writer.write(bytes(msg))
                await writer.drain()
                header = await reader.readexactly(HEADER_LENGTH)
                rest = await reader.readexactly(stream_frame_length(header) - HEADER_LENGTH)
        except TimeoutError:
            raise self._no_answer(method) from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise UnreachableError(f"the data connection closed during {method}: {exc}") from None
        resp = parse_stun(header + rest)
        if resp is None or resp.transaction_id != msg.transaction_id:
            raise TurnError(f"{method}: the server answered with something else")
        return resp

    async def request(
        self,
        method: Method,
        attrs: dict[str, Any],
        refused: Refused,
        exchange: Exchange | None = None,
    ) -> Message:
        """A transaction with long-term authentication; raise the matching error on failure."""
        for _ in range(MAX_AUTH_ROUNDS):
            resp = await (exchange or self.exchange)(build_request(method, attrs, self.auth))
            if self.auth is not None and not integrity_ok(resp, self.auth.key):
                raise AuthFailedError(
                    f"{method.name} response from the TURN server failed its integrity check"
                )
            if resp.message_class == Class.RESPONSE:
                return resp
            code, reason = error_of(resp)
            if code == 401:
                self.auth = self._challenged(resp, method, reason)
            elif code == 438 and self.auth is not None:
                self.auth = self._stale_nonce(resp, method)
            else:
                raise refused(method, code, reason)
        raise TurnError(f"{method.name} failed: the server kept asking for credentials")

    def _challenged(self, resp: Message, method: Method, reason: str) -> LongTermAuth:
        """RFC 8489 §9.2.3: a 401 to an unsigned request brings the realm and the nonce."""
        if self.auth is not None:
            raise AuthFailedError(
                f"authentication failed: the TURN server rejected user "
                f"{self.auth.username!r} in realm {self.auth.realm!r} (401 {reason})",
                401,
            )
        realm = resp.attributes.get("REALM")
        nonce = resp.attributes.get("NONCE")
        if realm is None or nonce is None:
            raise AuthFailedError(f"{method.name}: 401 without REALM and NONCE")
        if self.credentials is None:
            raise AuthFailedError(
                f"the TURN server requires credentials (realm {realm!r}) and none were given"
            )
        return LongTermAuth.derive(*self.credentials, str(realm), nonce)

    def _stale_nonce(self, resp: Message, method: Method) -> LongTermAuth:
        """RFC 8489 §9.2.4: a 438 brings a fresh nonce to retry with."""
        assert self.auth is not None
        nonce = resp.attributes.get("NONCE")
        realm = resp.attributes.get("REALM", self.auth.realm)
        if nonce is None or self.credentials is None:
            raise TurnError(f"{method.name} failed: the server kept asking for credentials")
        return LongTermAuth.derive(*self.credentials, realm, nonce)
