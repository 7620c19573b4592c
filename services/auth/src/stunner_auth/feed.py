"""The configs the auth service answers from, kept in sync with the CDS by one watch.

The shared CDS client (``stunner_common.io.cds.watch_configs``) resumes after disconnects and yields
each change once; this module parses each config and keeps the latest valid one per id. A config
that does not validate is dropped with a warning (the previous one of that id is forgotten too,
rather than handing out credentials the dataplane no longer accepts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from stunner_common.config import ConfigError, StunnerConfig, parse_config
from stunner_common.io.cds import CdsClient, CdsClientError, ConfigChange, TokenSource

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0


class ConfigFeed:
    """Owns one background task that mirrors every config the CDS serves."""

    def __init__(
        self, cds_url: str, *, token: str | TokenSource | None = None, timeout_s: float = 5.0
    ) -> None:
        self.client = CdsClient(cds_url, token=token, timeout_s=timeout_s)
        self.configs: dict[str, StunnerConfig] = {}
        self._cds_seen = False
        self._expected = 0
        self._received = False
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        """True once the CDS has answered and, if it holds configs, the watch has sent them."""
        return self._cds_seen and (self._expected == 0 or self._received)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="auth-cds-feed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _probe(self) -> None:
        """One plain GET: tells readiness how many configs the watch is about to send."""
        while True:
            try:
                body = json.loads(await self.client.get())
                self._expected = len(body.get("items") or [])
                self._cds_seen = True
                return
            except (CdsClientError, ValueError, AttributeError) as exc:
                log.info("CDS %s not answering yet: %s", self.client.netloc, exc)
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def _run(self) -> None:
        probe = asyncio.create_task(self._probe(), name="auth-cds-probe")
        try:
            async for change in self.client.watch():
                if isinstance(change, ConfigChange):
                    self._apply(change)
                else:
                    log.warning("ignoring a full-config frame: the CDS does not speak v2")
        except CdsClientError as exc:
            log.error("CDS watch failed for good: %s", exc)
            raise
        finally:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe

    def _apply(self, change: ConfigChange) -> None:
        self._received = True
        if change.config is None:
            self.configs.pop(change.id, None)
            log.info("config %s deleted", change.id)
            return
        try:
            self.configs[change.id] = parse_config(change.config, expand_env=False)
            log.info("config %s updated (rev %d)", change.id, change.rev)
        except ConfigError as exc:
            self.configs.pop(change.id, None)
            log.warning("ignoring invalid config %s: %s", change.id, exc)
