"""The one CDS client: a one-shot GET (httpx) and a WebSocket watch (``io.cds.websocket``).

``DeltaState`` (in ``delta.py``, re-exported here) is the sans-IO half of the ``stunner.cds.v2``
delta protocol. ``CdsClient`` is the I/O half:
``get`` fetches once; ``watch`` offers the v2 subprotocol, resumes with ``?since=REV&epoch=E`` after
a disconnect (capped backoff with jitter), falls back to upstream's full-config frames when the
server does not speak v2, and yields one item per change, so a caller never sees a duplicate or
misses a delete. Every request carries ``Authorization: Bearer <token>`` when a token is given.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from stunner_common.backoff import Backoff
from stunner_common.cds.delta import (
    CdsAddressError,
    CdsClientError,
    CdsHttpError,
    CdsProtocolError,
    CdsUnreachableError,
    ConfigChange,
    ConfigFrame,
    DeltaState,
)
from stunner_common.cds.wire import (
    CDS_V2_SUBPROTOCOL,
    EPOCH_HEADER,
    INITIAL_FRAMES_HEADER,
    RESYNC_HEADER,
    REV_HEADER,
    EnvelopeError,
    parse_envelope,
)
from stunner_common.io.cds.token import TokenSource
from stunner_common.io.cds.websocket import UpgradeRefused, WebSocketError, connect

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_CDS_PORT",
    "MAX_RESPONSE_BYTES",
    "PING_INTERVAL_S",
    "PONG_TIMEOUT_S",
    "REFUSED_STATUSES",
    "CdsAddressError",
    "CdsClient",
    "CdsClientError",
    "CdsHttpError",
    "CdsProtocolError",
    "CdsUnreachableError",
    "ConfigChange",
    "ConfigFrame",
    "DeltaState",
    "WatchItem",
    "cds_base_url",
    "config_path",
    "watch_configs",
    "watch_url",
]

log = logging.getLogger(__name__)


DEFAULT_CDS_PORT = 13478
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
PING_INTERVAL_S = 5.0
PONG_TIMEOUT_S = 8.0
# Statuses that mean "this watch will never be accepted as asked" (a tool gives up on them).
REFUSED_STATUSES = frozenset({400, 401, 403, 404})


def cds_base_url(address: str, default_port: int = DEFAULT_CDS_PORT) -> str:
    """The http(s) base URL of a CDS from ``host[:port]`` or an http(s)/ws(s) URL.

    A bare host gets ``default_port``; a URL keeps its own port (or its scheme's); any path,
    query or fragment is dropped; ws/wss become http/https.
    """
    text = address.strip()
    bare = "://" not in text
    try:
        parts = urlsplit(f"http://{text}" if bare else text)
        port = parts.port
    except ValueError as exc:
        raise CdsAddressError(f"invalid CDS address {address!r}: {exc}") from None
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme.lower(), parts.scheme.lower())
    if scheme not in ("http", "https") or not parts.hostname:
        raise CdsAddressError(f"invalid CDS address {address!r}: expected host:port or http(s)://")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if port is None and bare:
        port = default_port
    return f"{scheme}://{host}" + (f":{port}" if port is not None else "")


def config_path(namespace: str | None = None, name: str | None = None) -> str:
    """``/api/v1/configs``, narrowed to one namespace or one config."""
    path = "/api/v1/configs"
    if namespace is not None:
        path += "/" + quote(namespace, safe="")
        if name is not None:
            path += "/" + quote(name, safe="")
    return path


def watch_url(base_url: str, namespace: str | None = None, name: str | None = None) -> str:
    """The watch URL for all configs, one namespace, or one config, from ``http(s)``/``ws(s)``."""
    return CdsClient(base_url).url(namespace, name, {"watch": "true"}, websocket=True)


WatchItem = ConfigChange | ConfigFrame


class CdsClient:
    """One CDS server. ``get`` reads once; ``watch`` follows changes until the caller stops.

    ``connected`` is set while a watch connection is open; ``attempts`` and ``connects`` count
    watch connection attempts and successes (for status pages and tests).
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | TokenSource | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = CONNECT_TIMEOUT_S,
        ping_interval_s: float | None = PING_INTERVAL_S,
        pong_timeout_s: float | None = PONG_TIMEOUT_S,
        max_size: int = MAX_RESPONSE_BYTES,
    ) -> None:
        # Several replicas may be given, comma-separated: a failed watch or GET moves on to the
        # next one at once, and backs off only after every one of them failed in turn.
        self._bases = [cds_base_url(a) for a in address.split(",") if a.strip()]
        if not self._bases:
            raise CdsAddressError(f"invalid CDS address {address!r}: no address given")
        self._current = 0
        self._token = token if isinstance(token, TokenSource) else TokenSource(token)
        self._ssl_context = ssl_context
        self._timeout_s = timeout_s
        self._ping_interval_s = ping_interval_s
        self._pong_timeout_s = pong_timeout_s
        self._max_size = max_size
        self.connected = asyncio.Event()
        self.attempts = 0
        self.connects = 0

    @property
    def base_url(self) -> str:
        """The base URL of the CDS replica in use."""
        return self._bases[self._current]

    @property
    def _tls(self) -> bool:
        return self.base_url.startswith("https:")

    @property
    def _netloc(self) -> str:
        return urlsplit(self.base_url).netloc

    @property
    def netloc(self) -> str:
        return self._netloc

    def _next_replica(self) -> bool:
        """Move on to the next replica; True when that starts a new round over all of them."""
        self._current = (self._current + 1) % len(self._bases)
        if len(self._bases) > 1:
            log.info("CDS: trying replica %s", self._netloc)
        return self._current == 0

    def _headers(self) -> dict[str, str]:
        """The Authorization header with the token of the moment (a token file may rotate)."""
        token = self._token.current()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def url(
        self,
        namespace: str | None = None,
        name: str | None = None,
        params: Mapping[str, str] | None = None,
        *,
        websocket: bool = False,
    ) -> str:
        """The URL of a config, a namespace or all configs (http(s), or ws(s) for a watch)."""
        scheme = ("wss" if self._tls else "ws") if websocket else ("https" if self._tls else "http")
        query = urlencode(dict(params)) if params else ""
        return urlunsplit((scheme, self._netloc, config_path(namespace, name), query, ""))

    # --- one-shot ---------------------------------------------------------------------------

    async def get(
        self,
        namespace: str | None = None,
        name: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> bytes:
        """GET a config (or a list) once and return the body of the 200 answer.

        Raises ``CdsUnreachableError`` when the exchange fails and ``CdsHttpError`` for any other
        status; the whole exchange is bounded by the client's timeout and size limit.
        """
        for _ in range(len(self._bases) - 1):
            try:
                return await self._get_once(namespace, name, params)
            except CdsUnreachableError as exc:
                log.warning("CDS %s unreachable (%s)", self._netloc, exc)
                self._next_replica()
        return await self._get_once(namespace, name, params)

    async def _get_once(
        self,
        namespace: str | None,
        name: str | None,
        params: Mapping[str, str] | None,
    ) -> bytes:
        import httpx  # here, not at the top: the wire half is imported by servers too

        url = self.url(namespace, name, params)
        verify: ssl.SSLContext | bool = self._ssl_context if self._ssl_context else True
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                httpx.AsyncClient(
                    timeout=self._timeout_s, verify=verify, trust_env=False
                ) as client,
                client.stream(
                    "GET", url, headers={"Accept": "application/json", **self._headers()}
                ) as resp,
            ):
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > self._max_size:
                        raise CdsUnreachableError(
                            f"the CDS answer is larger than {self._max_size} bytes"
                        )
                status = resp.status_code
        except (httpx.HTTPError, OSError, TimeoutError, ssl.SSLError) as exc:
            detail = str(exc) or type(exc).__name__
            raise CdsUnreachableError(detail) from exc
        if status != 200:
            raise CdsHttpError(status, bytes(body).decode(errors="replace").strip())
        return bytes(body)

    # --- watch ------------------------------------------------------------------------------

    async def watch(
        self,
        namespace: str | None = None,
        name: str | None = None,
        params: Mapping[str, str] | None = None,
        *,
        state: DeltaState | None = None,
        offer_v2: bool = True,
        backoff: Backoff | None = None,
        rand: Callable[[], float] = random.random,
        give_up_on_refusal: bool = True,
    ) -> AsyncIterator[WatchItem]:
        """Yield every change of the topic, forever, reconnecting and resuming as needed.

        With the v2 subprotocol the items are ``ConfigChange``s (a full resync first reports the
        configs held before as ``resync`` deletes); without it, ``ConfigFrame``s. A malformed frame
        is logged and skipped; a frame that does not fit the state held forces a fresh snapshot.
        When ``give_up_on_refusal`` is set, a 400/401/403/404 answer to the upgrade raises
        ``CdsHttpError``; every other failure is retried with ``backoff``. Stop the watch by
        breaking out of the loop (or cancelling the task that iterates it).
        """
        state = state if state is not None else DeltaState()
        backoff = backoff or Backoff()
        one = f"{namespace}/{name}" if namespace is not None and name is not None else None
        attempt = 0
        fresh = False
        while True:
            resume = None if fresh else state.resume_params()
            fresh = False
            try:
                async for item in self._session(namespace, name, params, state, resume, offer_v2):
                    if isinstance(item, ConfigChange) and one is not None and item.id != one:
                        log.debug("ignoring a CDS change for %s", item.id)
                        continue
                    attempt = 0
                    yield item
                log.info("CDS %s closed the watch, reconnecting", self._netloc)
            except CdsProtocolError as exc:
                log.warning("CDS watch %s: %s; resyncing from a fresh snapshot", self._netloc, exc)
                fresh = True
            except UpgradeRefused as exc:
                status = exc.status
                if give_up_on_refusal and status in REFUSED_STATUSES:
                    raise CdsHttpError(status, exc.body.decode(errors="replace").strip()) from exc
                if status in (401, 403):
                    log.error(
                        "CDS %s refused the watch (%d %s): the bearer token is %s; set CDS_TOKEN "
                        "or --cds-token-file to the CDS's token. Keeping the current config, "
                        "retrying",
                        self._netloc,
                        status,
                        "Unauthorized" if status == 401 else "Forbidden",
                        "wrong" if self._headers() else "missing",
                    )
                else:
                    log.warning("CDS %s refused the watch (%d), retrying", self._netloc, status)
            except (OSError, TimeoutError, WebSocketError) as exc:
                log.warning("CDS watch %s failed: %r", self._netloc, exc)
            except Exception:
                # Whatever went wrong, never stop reconnecting.
                log.exception("CDS watch %s failed unexpectedly", self._netloc)
                fresh = True
            finally:
                self.connected.clear()
            if not self._next_replica():
                continue  # another replica is worth a try at once
            delay = backoff.delay_s(attempt, rand)
            attempt += 1
            log.debug("reconnecting to CDS %s in %.2f s", self._netloc, delay)
            await asyncio.sleep(delay)

    async def _session(
        self,
        namespace: str | None,
        name: str | None,
        params: Mapping[str, str] | None,
        state: DeltaState,
        resume: Mapping[str, str] | None,
        offer_v2: bool,
    ) -> AsyncIterator[WatchItem]:
        query = dict(params or {})
        if resume is not None and offer_v2:
            query.update(resume)
        query["watch"] = "true"
        url = self.url(namespace, name, query, websocket=True)
        self.attempts += 1
        async with asyncio.timeout(self._timeout_s):
            ws = await connect(
                url,
                subprotocols=[CDS_V2_SUBPROTOCOL] if offer_v2 else (),
                origin=self.base_url,
                headers=self._headers(),
                ssl_context=self._ssl_context,
                ping_interval_s=self._ping_interval_s,
                ping_timeout_s=self._pong_timeout_s,
                max_size=self._max_size,
            )
        async with ws:
            self.connects += 1
            self.connected.set()
            v2 = ws.subprotocol == CDS_V2_SUBPROTOCOL
            log.info("CDS watch %s connected (%s)", url, "delta" if v2 else "full-config")
            if v2:
                headers = ws.headers
                # A full snapshot follows (resync deletes first), or the server resumes our
                # state; a resume in another store epoch raises CdsProtocolError (resync).
                for gone in state.begin(
                    delta=headers.get(RESYNC_HEADER) == "delta",
                    epoch=headers.get(EPOCH_HEADER),
                    rev=_int(headers.get(REV_HEADER)),
                    frames=_int(headers.get(INITIAL_FRAMES_HEADER)),
                ):
                    yield gone
            async for frame in ws:
                if not isinstance(frame, str):
                    raise CdsProtocolError("binary frame from CDS")
                if not v2:
                    yield ConfigFrame(frame)
                    continue
                try:
                    envelope = parse_envelope(frame)
                except EnvelopeError as exc:
                    log.warning("ignoring a malformed CDS frame: %s", exc)
                    continue
                change = state.apply(envelope)  # raises CdsProtocolError when out of sync
                if change is not None:
                    yield change


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


async def watch_configs(
    base_url: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    token: str | TokenSource | None = None,
    ssl_context: ssl.SSLContext | None = None,
    state: DeltaState | None = None,
    min_backoff_s: float = 0.1,
    max_backoff_s: float = 5.0,
    open_timeout_s: float = CONNECT_TIMEOUT_S,
) -> AsyncIterator[ConfigChange]:
    """The v2 changes of a topic, for tools: ``CdsClient.watch`` without full-config frames."""
    client = CdsClient(base_url, token=token, ssl_context=ssl_context, timeout_s=open_timeout_s)
    backoff = Backoff(initial_s=min_backoff_s, cap_s=max_backoff_s)
    async for item in client.watch(namespace, name, state=state, backoff=backoff):
        if isinstance(item, ConfigChange):
            yield item
        else:
            log.warning(
                "ignoring a full-config frame: the CDS does not speak %s", CDS_V2_SUBPROTOCOL
            )
