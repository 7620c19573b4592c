"""A config file, loaded once or watched for changes.

The watcher polls the file's identity (inode, size, mtime) instead of using inotify: it needs no
extra dependency and handles every way editors and Kubernetes ConfigMap mounts update a file —
atomic rename over it, delete and recreate, truncate then write. A missing file, an empty file
(a write in progress) and invalid content are all skipped, so the last good config stays live.
Repeats of the config last emitted are dropped, as upstream does.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from stunner_common.config import ConfigError, is_zero_config, parse_config
from stunnerd.origin.base import ConfigEvent, ConfigOriginError, ignore_rejection, loaded_event

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 0.2
_Signature = tuple[int, int, int, int]


def _signature(path: Path) -> _Signature | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileOrigin:
    """Configs from a file path; `watch()` yields each distinct valid version."""

    def __init__(
        self,
        path: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        suppress_delete: bool = True,
    ) -> None:
        self.path = Path(path)
        self._env = env
        self._poll_interval_s = poll_interval_s
        self._suppress_delete = suppress_delete
        self.skipped = 0
        """File versions seen but not emitted (empty, unreadable, invalid or a delete)."""
        self.on_rejected = ignore_rejection

    @property
    def name(self) -> str:
        return f"file://{self.path}"

    async def load(self) -> ConfigEvent:
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise ConfigOriginError(f"cannot read config file {self.path}: {exc}") from exc
        return loaded_event(text, self._env, self.name, f"invalid config file {self.path}")

    async def watch(self) -> AsyncIterator[ConfigEvent]:
        seen: _Signature | None = None
        last_emitted: str | None = None
        missing_logged = False
        while True:
            sig = _signature(self.path)
            if sig is None:
                if not missing_logged:
                    log.warning("waiting for config file %s", self.path)
                    missing_logged = True
                seen = None
            elif sig != seen:
                seen = sig
                missing_logged = False
                event = self._read()
                if event is not None:
                    canonical = event.config.canonical_json()
                    if canonical != last_emitted:
                        last_emitted = canonical
                        yield event
            await asyncio.sleep(self._poll_interval_s)

    def _read(self) -> ConfigEvent | None:
        try:
            text = self.path.read_text()
        except OSError as exc:
            log.warning("cannot read config file %s: %s", self.path, exc)
            self.skipped += 1
            return None
        if not text.strip():
            log.debug("config file %s is empty, waiting for content", self.path)
            self.skipped += 1
            return None
        try:
            config = parse_config(text, env=self._env)
        except ConfigError as exc:
            log.warning("ignoring invalid config file %s: %s", self.path, exc)
            self.skipped += 1
            self.on_rejected(f"invalid config file {self.path}: {exc}", None, None)
            return None
        except Exception:
            log.exception("ignoring config file %s: parsing failed unexpectedly", self.path)
            self.skipped += 1
            return None
        if self._suppress_delete and is_zero_config(config):
            log.info("ignoring delete configuration update from %s", self.path)
            self.skipped += 1
            return None
        return ConfigEvent(config, self.name)
