"""The config discovery client: a one-shot GET, or a WebSocket watch that survives CDS outages.

The watch offers the `stunner.cds.v2` subprotocol. When the server accepts it, frames are
envelopes (snapshot, JSON patch against the revision we hold, delete) and a reconnect resumes with
`?since=<rev>`; otherwise each text frame is one full config, as upstream. Either way a bad frame
is logged and skipped, deletes are dropped (a dataplane being drained must keep its listeners),
and a dropped or unreachable server never clears the running config: the loop reconnects with
capped, jittered exponential backoff and the caller keeps serving what it has.

Patches apply to the config as the server sent it (before `$VAR` substitution), so the base stays
byte-identical to the server's copy and every patched result is re-validated in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidURI, WebSocketException
from websockets.typing import Origin, Subprotocol

from stunner_common.cds import (
    CDS_V2_SUBPROTOCOL,
    RESYNC_HEADER,
    CdsProtocolError,
    DeltaState,
    parse_envelope,
)
from stunner_common.config import ConfigError, is_zero_config, parse_config, zero_config
from stunnerd.origin.backoff import Backoff
from stunnerd.origin.base import ConfigEvent, ConfigOriginError

log = logging.getLogger(__name__)

CDS_CONNECT_TIMEOUT_S = 10.0
CDS_PING_INTERVAL_S = 5.0
CDS_PONG_TIMEOUT_S = 8.0
MAX_HTTP_RESPONSE_BYTES = 16 * 1024 * 1024


class CdsOrigin:
    """A CDS server at `base_url` (http(s):// or ws(s)://) serving config `namespace/name`."""

    def __init__(
        self,
        base_url: str,
        namespace: str,
        name: str,
        *,
        node: str | None = None,
        env: Mapping[str, str] | None = None,
        backoff: Backoff | None = None,
        rand: Callable[[], float] = random.random,
        connect_timeout_s: float = CDS_CONNECT_TIMEOUT_S,
        ping_interval_s: float = CDS_PING_INTERVAL_S,
        pong_timeout_s: float = CDS_PONG_TIMEOUT_S,
        offer_v2: bool = True,
        suppress_delete: bool = True,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
            raise ConfigOriginError(f"invalid CDS address {base_url!r}")
        self._tls = parts.scheme in ("https", "wss")
        self._netloc = parts.netloc
        self.namespace = namespace
        self.name = name
        self._node = node or None
        self._env = env
        self._backoff = backoff or Backoff()
        self._rand = rand
        self._connect_timeout_s = connect_timeout_s
        self._ping_interval_s = ping_interval_s
        self._pong_timeout_s = pong_timeout_s
        self._offer_v2 = offer_v2
        self._suppress_delete = suppress_delete
        # Delta-protocol state: the raw config as the server holds it, kept across reconnects.
        self._state = DeltaState()
        self.connected = asyncio.Event()
        self.connects = 0
        self.attempts = 0

    @property
    def ident(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def revision(self) -> int | None:
        """The CDS revision of the config held (delta protocol only)."""
        return self._state.rev if self.ident in self._state.configs else None

    @property
    def path(self) -> str:
        return f"/api/v1/configs/{quote(self.namespace, safe='')}/{quote(self.name, safe='')}"

    def http_url(self) -> str:
        query = f"?{urlencode({'node': self._node})}" if self._node else ""
        return f"{'https' if self._tls else 'http'}://{self._netloc}{self.path}{query}"

    def ws_url(self, since: int | None = None) -> str:
        params: dict[str, str] = {}
        if self._node:
            params["node"] = self._node
        if since is not None:
            params["since"] = str(since)
        params["watch"] = "true"
        return f"{'wss' if self._tls else 'ws'}://{self._netloc}{self.path}?{urlencode(params)}"

    # --- one-shot ---------------------------------------------------------------------------

    async def load(self) -> ConfigEvent:
        """GET the config once; any failure is a `ConfigOriginError` naming the cause."""
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                status, body = await self._http_get()
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise ConfigOriginError(f"CDS {self.http_url()} unreachable: {exc!r}") from exc
        if status != 200:
            text = body.decode(errors="replace").strip()
            raise ConfigOriginError(f"CDS {self.http_url()}: HTTP error (status: {status}): {text}")
        try:
            config = parse_config(body, env=self._env)
        except ConfigError as exc:
            raise ConfigOriginError(f"CDS {self.http_url()} sent an invalid config: {exc}") from exc
        return ConfigEvent(config, self.http_url())

    async def _http_get(self) -> tuple[int, bytes]:
        host, _, port = self._netloc.rpartition(":")
        if not host or not port.isdigit():
            host, port = self._netloc, "443" if self._tls else "80"
        ctx = ssl.create_default_context() if self._tls else None
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=ctx)
        try:
            target = self.http_url().split(self._netloc, 1)[1]
            writer.write(
                f"GET {target} HTTP/1.0\r\nHost: {self._netloc}\r\n"
                "Accept: application/json\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            raw = b""
            while chunk := await reader.read(65536):  # HTTP/1.0: the body ends at EOF
                raw += chunk
                if len(raw) > MAX_HTTP_RESPONSE_BYTES:
                    raise OSError("CDS response too large")
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()
        head, _, body = raw.partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].split()
        if len(status_line) < 2 or not status_line[1].isdigit():
            raise OSError(f"malformed HTTP response {head[:80]!r}")
        return int(status_line[1]), body

    # --- watch ------------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[ConfigEvent]:
        """Yield configs forever; reconnect with backoff whenever the link fails."""
        attempt = 0
        while True:
            try:
                async for event in self._session():
                    attempt = 0
                    yield event
                log.info("CDS %s closed the watch, reconnecting", self._netloc)
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI, WebSocketException) as exc:
                log.warning("CDS watch %s failed: %r", self._netloc, exc)
            except CdsProtocolError as exc:
                log.warning("CDS watch %s: %s; resyncing from a fresh snapshot", self._netloc, exc)
                self._state.reset()
            except Exception:
                # Whatever went wrong, never stop reconnecting (upstream could get stuck here).
                log.exception("CDS watch %s failed unexpectedly", self._netloc)
                self._state.reset()
            finally:
                self.connected.clear()
            delay = self._backoff.delay_s(attempt, self._rand)
            attempt += 1
            log.debug("reconnecting to CDS in %.2f s", delay)
            await asyncio.sleep(delay)

    async def _session(self) -> AsyncIterator[ConfigEvent]:
        since = self.revision
        self.attempts += 1
        url = self.ws_url(since)
        origin = f"{'https' if self._tls else 'http'}://{self._netloc}"
        ctx = ssl.create_default_context() if self._tls else None
        ws: ClientConnection
        async with asyncio.timeout(self._connect_timeout_s):
            ws = await connect(
                url,
                subprotocols=[Subprotocol(CDS_V2_SUBPROTOCOL)] if self._offer_v2 else None,
                origin=Origin(origin),
                proxy=None,
                ssl=ctx,
                ping_interval=self._ping_interval_s,
                ping_timeout=self._pong_timeout_s,
                open_timeout=self._connect_timeout_s,
                max_size=MAX_HTTP_RESPONSE_BYTES,
            )
        async with ws:
            self.connects += 1
            self.connected.set()
            v2 = ws.subprotocol == CDS_V2_SUBPROTOCOL
            if v2 and (ws.response is None or ws.response.headers.get(RESYNC_HEADER) != "delta"):
                self._state.reset()  # a full snapshot follows
            log.info("CDS watch %s connected (%s)", url, "delta" if v2 else "full-config")
            async for frame in ws:
                if not isinstance(frame, str):
                    raise CdsProtocolError("binary frame from CDS")
                event = self._handle_v2(frame) if v2 else self._handle_full(frame)
                if event is not None:
                    yield event

    def _accept(
        self, raw: bytes | str | dict[str, Any], revision: int | None
    ) -> ConfigEvent | None:
        try:
            config = parse_config(raw, env=self._env)
        except ConfigError as exc:
            log.warning("ignoring invalid config from CDS: %s", exc)
            return None
        if self._suppress_delete and is_zero_config(config):
            log.info("ignoring delete configuration update")
            return None
        return ConfigEvent(config, self._netloc, revision)

    def _handle_full(self, frame: str) -> ConfigEvent | None:
        if not frame.strip():
            log.warning("ignoring empty frame from CDS")
            return None
        return self._accept(frame, None)

    def _handle_v2(self, frame: str) -> ConfigEvent | None:
        try:
            envelope = parse_envelope(frame)
        except ValidationError as exc:
            log.warning("ignoring a malformed CDS frame: %s", exc.errors()[:1])
            return None
        if envelope.id != self.ident:
            log.debug("ignoring envelope for %s", envelope.id)
            return None
        change = self._state.apply(envelope)  # raises CdsProtocolError when out of sync
        if change is None:
            return None
        if change.config is None:
            if self._suppress_delete:
                log.info("ignoring delete configuration update (rev %d)", change.rev)
                return None
            return self._accept(zero_config(self.ident).canonical_json(), change.rev)
        return self._accept(change.config, change.rev)
