"""The CDS's in-memory mirror of the Redis config store, as a pure state machine.

It holds every config with the revision of its last change, plus tombstones for deleted ids, and
turns a loaded snapshot or a stream entry into the list of ``Change`` values watchers must hear
about. Revisions count within the store's epoch (``stunner_common.io.store``): an entry of another
epoch means the store lost its history (Redis came back empty, or was rolled back) and the caller
must reload the snapshot. Within an epoch revisions are contiguous (each change increments
``stunner:rev`` once and appends one stream entry in the same script), so an entry whose revision
is not ``rev + 1`` means the stream lost entries (trimmed) and the snapshot is reloaded too; an
entry at or below ``rev`` is a replay and is ignored. No I/O here: tests drive it with values.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from stunner_common.io.store import Position, Snapshot, StoreEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Entry:
    rev: int
    text: str
    config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    """``id`` changed at ``rev`` from ``old`` to ``new`` (None: absent)."""

    id: str
    rev: int
    old: dict[str, Any] | None
    new: dict[str, Any] | None


class StreamGapError(Exception):
    """A stream entry skipped revisions: entries were lost and the snapshot must be reloaded."""


class StoreResetError(StreamGapError):
    """A stream entry of another epoch: the store's history was lost (reload, resync all)."""


def parse_config_text(config_id: str, text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        log.warning("ignoring config %s: stored value is not JSON (%s)", config_id, exc)
        return None
    if not isinstance(data, dict):
        log.warning("ignoring config %s: stored value is not a JSON object", config_id)
        return None
    return data


class ConfigMirror:
    """Configs by id at revision ``rev`` of ``epoch``; ``last_event_id`` is where the stream tail
    resumes."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.tombstones: dict[str, int] = {}
        self.rev = 0
        self.epoch = ""
        self.last_event_id = "0-0"
        self.loaded = False

    def is_reset(self, snapshot: Snapshot) -> bool:
        """Whether loading ``snapshot`` crosses a lost history: another epoch, or a revision
        below ours (a store rolled back within its epoch). Revisions held by clients then mean
        nothing here and every v2 watcher must start over. A mirror at revision 0 (a store
        never written) gave out no revision, so nothing can be confused."""
        return (
            self.loaded
            and self.rev > 0
            and (snapshot.epoch != self.epoch or snapshot.rev < self.rev)
        )

    def resync_reason(self, at: Position, following_rev: int | None) -> str | None:
        """Why the snapshot must be reloaded after a reconnect to a store ``at`` (None: the
        stream tail can resume). ``following_rev`` is the revision of the stream entry after
        ``last_event_id`` (None: there is none, or it was not read)."""
        if not self.loaded:
            return "initial load"
        if at.epoch != self.epoch:
            return f"store epoch {at.epoch!r}, mirror at epoch {self.epoch!r}"
        if at.rev == self.rev or (at.rev > self.rev and following_rev == self.rev + 1):
            return None
        return f"store at revision {at.rev}, mirror at {self.rev}"

    def load(self, snapshot: Snapshot) -> list[Change]:
        """Replace the state with ``snapshot``; return what differs from the state before.

        The changes come in revision order (a delete at the revision the store recorded for
        it), so a client that got only the first of them and resumes from the last revision it
        saw misses none of the rest.
        """
        entries: dict[str, Entry] = {}
        for config_id, text in snapshot.configs.items():
            old = self.entries.get(config_id)
            if old is not None and old.text == text:
                entries[config_id] = Entry(snapshot.revs.get(config_id, old.rev), text, old.config)
                continue
            config = parse_config_text(config_id, text)
            if config is not None:
                entries[config_id] = Entry(snapshot.revs.get(config_id, snapshot.rev), text, config)
        changes: list[Change] = []
        for config_id in sorted(self.entries.keys() | entries.keys()):
            before = self.entries.get(config_id)
            after = entries.get(config_id)
            if after is None:
                assert before is not None
                gone_at = snapshot.revs.get(config_id, snapshot.rev)
                changes.append(Change(config_id, gone_at, before.config, None))
            elif before is None or before.text != after.text:
                changes.append(
                    Change(config_id, after.rev, before.config if before else None, after.config)
                )
        tombstones = {
            config_id: rev
            for config_id, rev in snapshot.revs.items()
            if config_id not in snapshot.configs
        }
        for change in changes:
            if change.new is None:
                tombstones[change.id] = max(tombstones.get(change.id, 0), change.rev)
        self.entries = entries
        self.tombstones = tombstones
        self.rev = snapshot.rev
        self.epoch = snapshot.epoch
        self.last_event_id = snapshot.last_event_id
        self.loaded = True
        changes.sort(key=lambda c: c.rev)
        return changes

    def apply(self, event: StoreEvent) -> Change | None:
        """Apply one stream entry; None if watchers need not hear of it."""
        if event.epoch != self.epoch:
            raise StoreResetError(
                f"stream entry of store epoch {event.epoch!r} at revision {event.rev}, "
                f"mirror at epoch {self.epoch!r} revision {self.rev}"
            )
        if event.rev <= self.rev:
            self.last_event_id = max(self.last_event_id, event.event_id, key=_stream_key)
            return None
        if event.rev != self.rev + 1:
            raise StreamGapError(f"stream jumped from revision {self.rev} to {event.rev}")
        self.rev = event.rev
        self.last_event_id = event.event_id
        before = self.entries.get(event.id)
        if event.op == "delete":
            self.tombstones[event.id] = event.rev
            if before is None:
                return None
            del self.entries[event.id]
            return Change(event.id, event.rev, before.config, None)
        if before is not None and before.text == event.config:
            self.entries[event.id] = Entry(event.rev, before.text, before.config)
            return None
        config = parse_config_text(event.id, event.config)
        if config is None:
            return None
        self.tombstones.pop(event.id, None)
        self.entries[event.id] = Entry(event.rev, event.config, config)
        return Change(event.id, event.rev, before.config if before else None, config)

    def skip_to(self, event_id: str) -> None:
        """Resume the stream after ``event_id`` (used to step over malformed entries)."""
        self.last_event_id = max(self.last_event_id, event_id, key=_stream_key)

    def changed_since(self, since: int) -> tuple[list[tuple[str, Entry]], list[tuple[str, int]]]:
        """Entries changed after ``since`` and ids deleted after it, both sorted by revision."""
        changed = sorted(
            ((i, e) for i, e in self.entries.items() if e.rev > since), key=lambda x: x[1].rev
        )
        deleted = sorted(
            ((i, r) for i, r in self.tombstones.items() if r > since), key=lambda x: x[1]
        )
        return changed, deleted


def _stream_key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)
