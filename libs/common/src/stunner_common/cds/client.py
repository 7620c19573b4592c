"""A small client for the CDS delta protocol (``stunner.cds.v2``), for tools and stunnerd.

``DeltaState`` is the sans-IO half: feed it envelopes, it keeps the configs and the revision and
tells you what changed. ``watch_configs`` is the I/O half: it connects with the v2 subprotocol,
resumes with ``?since=REV`` after a disconnect (backoff with jitter) and yields one ``ConfigChange``
per config that changed, so a caller never sees a duplicate or misses a delete.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import jsonpatch
import pydantic

from stunner_common.cds.wire import (
    CDS_V2_SUBPROTOCOL,
    RESYNC_HEADER,
    DeleteEnvelope,
    PatchEnvelope,
    SnapshotEnvelope,
    parse_envelope,
)

log = logging.getLogger(__name__)


class CdsClientError(Exception):
    """Base of the client's errors."""


class CdsProtocolError(CdsClientError):
    """The server sent something that does not fit the state we hold (resync needed)."""


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """``config`` is the new config of ``id`` at ``rev``, or None when ``id`` was deleted."""

    id: str
    rev: int
    config: dict[str, Any] | None


class DeltaState:
    """The configs a v2 watcher holds, updated envelope by envelope."""

    def __init__(self) -> None:
        self.configs: dict[str, dict[str, Any]] = {}
        self.rev = 0

    def reset(self) -> list[ConfigChange]:
        """Forget everything (the server is about to send a full snapshot)."""
        gone = [ConfigChange(i, self.rev, None) for i in sorted(self.configs)]
        self.configs.clear()
        self.rev = 0
        return gone

    def apply(
        self, envelope: SnapshotEnvelope | PatchEnvelope | DeleteEnvelope
    ) -> ConfigChange | None:
        """Apply one envelope; return the change, or None when it changed nothing."""
        self.rev = max(self.rev, envelope.rev)
        if isinstance(envelope, SnapshotEnvelope):
            if self.configs.get(envelope.id) == envelope.config:
                return None
            self.configs[envelope.id] = envelope.config
            return ConfigChange(envelope.id, envelope.rev, envelope.config)
        if isinstance(envelope, PatchEnvelope):
            old = self.configs.get(envelope.id)
            if old is None:
                raise CdsProtocolError(
                    f"patch for {envelope.id!r}, which this client does not hold"
                )
            try:
                new = jsonpatch.apply_patch(old, envelope.patch, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise CdsProtocolError(f"patch for {envelope.id!r} does not apply: {exc}") from exc
            if not isinstance(new, dict):
                raise CdsProtocolError(f"patch for {envelope.id!r} did not yield an object")
            self.configs[envelope.id] = new
            return ConfigChange(envelope.id, envelope.rev, new)
        if self.configs.pop(envelope.id, None) is None:
            return None
        return ConfigChange(envelope.id, envelope.rev, None)


def watch_url(base_url: str, namespace: str | None = None, name: str | None = None) -> str:
    """The watch URL for all configs, one namespace, or one config, from ``http(s)``/``ws(s)``."""
    parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = "/api/v1/configs"
    if namespace is not None:
        path += "/" + quote(namespace, safe="")
        if name is not None:
            path += "/" + quote(name, safe="")
    return urlunsplit((scheme, parts.netloc, path, urlencode({"watch": "true"}), ""))


async def watch_configs(
    base_url: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    state: DeltaState | None = None,
    min_backoff_s: float = 0.1,
    max_backoff_s: float = 5.0,
    open_timeout_s: float = 10.0,
) -> AsyncIterator[ConfigChange]:
    """Yield every config change for the topic, forever, reconnecting and resuming as needed.

    Stop it by breaking out of the loop (or cancelling the task that iterates it).
    """
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus, WebSocketException

    state = state if state is not None else DeltaState()
    base = watch_url(base_url, namespace, name)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    backoff_s = min_backoff_s
    resume = False
    while True:
        url = base + (f"&since={state.rev}" if resume else "")
        try:
            async with connect(
                url,
                subprotocols=[CDS_V2_SUBPROTOCOL],  # type: ignore[list-item]
                additional_headers=headers,
                ssl=ssl_context,
                open_timeout=open_timeout_s,
                max_size=None,
            ) as ws:
                backoff_s = min_backoff_s
                resync = ws.response.headers.get(RESYNC_HEADER, "full") if ws.response else "full"
                if resync != "delta":
                    for change in state.reset():
                        yield change
                async for frame in ws:
                    try:
                        applied = state.apply(parse_envelope(frame))
                    except pydantic.ValidationError as exc:
                        log.warning("ignoring a malformed CDS frame: %s", exc)
                        continue
                    if applied is not None:
                        yield applied
                resume = True
        except CdsProtocolError as exc:
            log.warning("CDS stream out of sync, resyncing: %s", exc)
            resume = False
        except InvalidStatus as exc:
            if exc.response.status_code in (400, 401, 403, 404):
                raise CdsClientError(
                    f"CDS refused the watch ({exc.response.status_code}): "
                    f"{exc.response.body.decode(errors='replace') if exc.response.body else ''}"
                ) from exc
            log.info("CDS watch refused (%s), retrying", exc.response.status_code)
            resume = True
        except (OSError, TimeoutError, WebSocketException) as exc:
            log.info("CDS connection lost (%s), reconnecting", exc)
            resume = True
        await asyncio.sleep(backoff_s * (0.5 + random.random()))
        backoff_s = min(max_backoff_s, backoff_s * 2)
