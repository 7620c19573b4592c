"""Reading the config store: one consistent snapshot, then the change stream after it.

``load_snapshot`` reads the hash, the per-id revisions, the counter, the epoch and the newest
stream id in one MULTI/EXEC, so the stream can be tailed from exactly the point the snapshot
reflects. Stream entries are parsed into ``StoreEvent`` values; the caller checks that they belong
to the epoch it holds and that their revisions are contiguous, to detect entries lost to trimming
or to a Redis that came back empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis

from stunner_common.contracts.redis_keys import (
    CONFIGS_HASH,
    EPOCH_FIELD,
    EVENTS_STREAM,
    META_HASH,
    REV_COUNTER,
    REVS_HASH,
)

STREAM_START = "0-0"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole store at revision ``rev`` of ``epoch``; the stream continues after
    ``last_event_id``. ``epoch`` is "" for a store no publisher has written since it was
    emptied (or one written before epochs existed)."""

    configs: dict[str, str]
    revs: dict[str, int]
    rev: int
    last_event_id: str
    epoch: str = ""


@dataclass(frozen=True, slots=True)
class Position:
    """Where the store is: its epoch and revision counter."""

    epoch: str
    rev: int


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """One change-stream entry. ``config`` is the canonical JSON, empty for a delete; ``epoch``
    is the epoch it was written in ("" for entries written before epochs existed)."""

    event_id: str
    op: Literal["upsert", "delete"]
    id: str
    rev: int
    config: str
    epoch: str = ""


@dataclass(frozen=True, slots=True)
class EventBatch:
    """Parsed entries, and the id of the last entry read (malformed ones included), if any."""

    events: list[StoreEvent]
    last_id: str | None


def stream_id_ms(event_id: str) -> int:
    """The Redis server time (ms since the epoch) embedded in a stream id."""
    return int(event_id.split("-", 1)[0])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_event(event_id: Any, fields: dict[Any, Any]) -> StoreEvent | None:
    """Parse one stream entry; None for an entry that does not follow the layout."""
    data = {_text(k): _text(v) for k, v in fields.items()}
    op = data.get("op")
    try:
        rev = int(data.get("rev", ""))
    except ValueError:
        return None
    config_id = data.get("id", "")
    if not config_id:
        return None
    epoch = data.get("epoch", "")
    if op == "upsert":
        return StoreEvent(_text(event_id), "upsert", config_id, rev, data.get("config", ""), epoch)
    if op == "delete":
        return StoreEvent(_text(event_id), "delete", config_id, rev, "", epoch)
    return None


class ConfigReader:
    """Read-only access to the config store for the CDS and other tools."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def load_snapshot(self) -> Snapshot:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(CONFIGS_HASH)
            pipe.hgetall(REVS_HASH)
            pipe.get(REV_COUNTER)
            pipe.xrevrange(EVENTS_STREAM, count=1)
            pipe.hget(META_HASH, EPOCH_FIELD)
            configs_raw, revs_raw, rev_raw, last, epoch_raw = await pipe.execute()
        configs = {_text(k): _text(v) for k, v in configs_raw.items()}
        revs: dict[str, int] = {}
        for k, v in revs_raw.items():
            try:
                revs[_text(k)] = int(v)
            except ValueError:
                continue
        last_id = _text(last[0][0]) if last else STREAM_START
        epoch = _text(epoch_raw) if epoch_raw is not None else ""
        return Snapshot(configs, revs, int(rev_raw or 0), last_id, epoch)

    async def current_rev(self) -> int:
        return int(await self._redis.get(REV_COUNTER) or 0)

    async def current_epoch(self) -> str:
        raw = await self._redis.hget(META_HASH, EPOCH_FIELD)
        return _text(raw) if raw is not None else ""

    async def position(self) -> Position:
        """The epoch and the revision counter, read together (one MULTI/EXEC)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hget(META_HASH, EPOCH_FIELD)
            pipe.get(REV_COUNTER)
            epoch_raw, rev_raw = await pipe.execute()
        return Position(_text(epoch_raw) if epoch_raw is not None else "", int(rev_raw or 0))

    async def read_events(
        self, after_id: str, *, block_ms: int | None = None, count: int = 1000
    ) -> EventBatch:
        """Entries after ``after_id`` (waiting up to ``block_ms`` for one when given).

        Malformed entries are left out of ``events`` but still move ``last_id``, so a reader
        never re-reads them; a change they hid shows up as a jump in revisions.
        """
        reply: Any = await self._redis.xread({EVENTS_STREAM: after_id}, count=count, block=block_ms)
        events: list[StoreEvent] = []
        last_id: str | None = None
        for _stream, entries in reply or []:
            for event_id, fields in entries:
                last_id = _text(event_id)
                event = parse_event(event_id, fields or {})
                if event is not None:
                    events.append(event)
        return EventBatch(events, last_id)

    async def events_after(self, after_id: str, *, count: int = 1) -> list[tuple[str, int]]:
        """(stream id, rev) of the first ``count`` entries after ``after_id``, without blocking."""
        entries: Any = await self._redis.xrange(EVENTS_STREAM, min=f"({after_id}", count=count)
        out: list[tuple[str, int]] = []
        for event_id, fields in entries or []:
            event = parse_event(event_id, fields or {})
            out.append((_text(event_id), event.rev if event else -1))
        return out

    async def ping(self) -> bool:
        return bool(await self._redis.ping())
