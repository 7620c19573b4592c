"""stunnerd's config origin on the CDS: a one-shot GET, or a watch that survives CDS outages.

Both ride on the shared `stunner_common.io.cds.CdsClient`; this module turns what it yields into
validated configs for the reconciler.

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
import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from stunner_common.backoff import Backoff
from stunner_common.config import ConfigError, is_zero_config, parse_config, zero_config
from stunner_common.io.cds import (
    CdsAddressError,
    CdsClient,
    CdsHttpError,
    CdsUnreachableError,
    ConfigChange,
    DeltaState,
    TokenSource,
)
from stunnerd.origin.base import ConfigEvent, ConfigOriginError, ignore_rejection, loaded_event

log = logging.getLogger(__name__)

CDS_CONNECT_TIMEOUT_S = 10.0
CDS_PING_INTERVAL_S = 5.0
CDS_PONG_TIMEOUT_S = 8.0
CDS_RECONNECT_MAX_S = 2.0
"""Reconnects back off up to this: a CDS that returns is followed within about this long."""


@dataclass(frozen=True, slots=True)
class CdsOptions:
    """Which config stunnerd asks the CDS for and how it keeps the link: one frozen value, built
    from the settings in `stunnerd.app` (tests change one field with `dataclasses.replace`)."""

    namespace: str
    name: str
    node: str | None = None
    """This node's name (`STUNNER_NODENAME`): the CDS fills the node-address placeholder."""
    connect_timeout_s: float = CDS_CONNECT_TIMEOUT_S
    ping_interval_s: float = CDS_PING_INTERVAL_S
    pong_timeout_s: float = CDS_PONG_TIMEOUT_S
    offer_v2: bool = True
    """Offer the `stunner.cds.v2` subprotocol (deltas, resume); False: full configs only."""
    suppress_delete: bool = True
    """Drop delete updates here; False: they reach the reconciler, which ignores and counts them."""


class CdsOrigin:
    """A CDS server at `base_url` (http(s):// or ws(s)://) serving the config `options` name.

    `env` is what `$VAR`s in a config expand from; `token` authenticates to the CDS (a
    `TokenSource` re-reads its file when it changes).
    """

    def __init__(
        self,
        base_url: str,
        options: CdsOptions,
        *,
        env: Mapping[str, str] | None = None,
        token: str | TokenSource | None = None,
        ssl_context: ssl.SSLContext | None = None,
        backoff: Backoff | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        for address in base_url.split(","):  # several replicas: "ws://a:13478,ws://b:13478"
            parts = urlsplit(address.strip())
            if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
                raise ConfigOriginError(f"invalid CDS address {address.strip()!r}")
        try:
            self._client = CdsClient(
                base_url,
                token=token,
                ssl_context=ssl_context,
                timeout_s=options.connect_timeout_s,
                ping_interval_s=options.ping_interval_s,
                pong_timeout_s=options.pong_timeout_s,
            )
        except CdsAddressError as exc:
            raise ConfigOriginError(str(exc)) from exc
        self.options = options
        self._netloc = self._client.netloc
        self.namespace = options.namespace
        self.name = options.name
        self._node = options.node or None
        self._env = env
        self._backoff = backoff or Backoff(cap_s=CDS_RECONNECT_MAX_S)
        self._rand = rand
        self._offer_v2 = options.offer_v2
        self._suppress_delete = options.suppress_delete
        # Delta-protocol state: the raw config as the server holds it, kept across reconnects.
        self._state = DeltaState()
        self.on_rejected = ignore_rejection

    @property
    def ident(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def connected(self) -> asyncio.Event:
        """Set while the watch connection is open."""
        return self._client.connected

    @property
    def connects(self) -> int:
        return self._client.connects

    @property
    def attempts(self) -> int:
        return self._client.attempts

    @property
    def revision(self) -> int | None:
        """The CDS revision of the config held (delta protocol only)."""
        return self._state.rev if self.ident in self._state.configs else None

    @property
    def path(self) -> str:
        return f"/api/v1/configs/{quote(self.namespace, safe='')}/{quote(self.name, safe='')}"

    def _params(self) -> dict[str, str]:
        return {"node": self._node} if self._node else {}

    def http_url(self) -> str:
        return self._client.url(self.namespace, self.name, self._params())

    def ws_url(self, since: int | None = None) -> str:
        params = self._params()
        if since is not None:
            params["since"] = str(since)
        params["watch"] = "true"
        return self._client.url(self.namespace, self.name, params, websocket=True)

    # --- one-shot ---------------------------------------------------------------------------

    async def load(self) -> ConfigEvent:
        """GET the config once; any failure is a `ConfigOriginError` naming the cause."""
        try:
            body = await self._client.get(self.namespace, self.name, self._params())
        except CdsUnreachableError as exc:
            raise ConfigOriginError(f"CDS {self.http_url()} unreachable: {exc}") from exc
        except CdsHttpError as exc:
            raise ConfigOriginError(f"CDS {self.http_url()}: {exc}") from exc
        url = self.http_url()
        return loaded_event(body, self._env, url, f"CDS {url} sent an invalid config")

    # --- watch ------------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[ConfigEvent]:
        """Yield configs forever; the client reconnects with backoff whenever the link fails."""
        async for item in self._client.watch(
            self.namespace,
            self.name,
            self._params(),
            state=self._state,
            offer_v2=self._offer_v2,
            backoff=self._backoff,
            rand=self._rand,
            give_up_on_refusal=False,
        ):
            if isinstance(item, ConfigChange):
                event = self._handle_v2(item)
            else:
                event = self._handle_full(item.text)
            if event is not None:
                yield event

    def _accept(
        self, raw: bytes | str | dict[str, Any], revision: int | None
    ) -> ConfigEvent | None:
        epoch = self._state.epoch if revision is not None else None
        try:
            config = parse_config(raw, env=self._env)
        except ConfigError as exc:
            log.warning("ignoring invalid config from CDS: %s", exc)
            self.on_rejected(f"invalid config from CDS: {exc}", revision, epoch)
            return None
        if self._suppress_delete and is_zero_config(config):
            log.info("ignoring delete configuration update")
            return None
        return ConfigEvent(config, self._netloc, revision, epoch)

    def _handle_full(self, frame: str) -> ConfigEvent | None:
        if not frame.strip():
            log.warning("ignoring empty frame from CDS")
            return None
        return self._accept(frame, None)

    def _handle_v2(self, change: ConfigChange) -> ConfigEvent | None:
        if change.config is None:
            if change.resync:
                return None  # a fresh snapshot follows; keep serving until it does
            if self._suppress_delete:
                log.info("ignoring delete configuration update (rev %d)", change.rev)
                return None
            return self._accept(zero_config(self.ident).canonical_json(), change.rev)
        return self._accept(change.config, change.rev)
