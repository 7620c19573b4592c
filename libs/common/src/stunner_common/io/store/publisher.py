"""The one way to write configs into Redis: atomic, numbered, and silent when nothing changed.

Every change is a Lua script that compares the canonical JSON already stored, and only when it
differs increments ``stunner:rev``, writes the hash, records the revision in ``stunner:revs`` and
appends the stream entry — all in one atomic step, so a reader never sees a hash write without its
event or two changes with one revision. ``replace_all`` applies a whole desired set in one script.

Revisions only mean something within one history of the store, so every script also makes sure
the store has an *epoch* (``stunner:meta`` field ``epoch``, a random id): a store that lost its
data (a Redis that came back empty, a flush) has no epoch, and the next write gives it a new one.
A store rolled back under a publisher (an older snapshot restored: the counter is below what this
publisher saw in that epoch) gets a new epoch too. Every stream entry carries the
epoch it was written in, so readers never confuse revision N of one history with N of another.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import redis.asyncio as aioredis

from stunner_common.contracts.redis_keys import (
    CONFIGS_HASH,
    EVENTS_STREAM,
    META_HASH,
    REV_COUNTER,
    REVS_HASH,
)

KNOWN_EPOCHS = 16
"""How many epochs a publisher remembers its highest revision of (rollback detection)."""

DEFAULT_STREAM_MAXLEN = 10_000
"""Approximate length the change stream is trimmed to (``XADD MAXLEN ~``)."""

# KEYS: configs, revs, stream, counter, meta. ARGV starts with three header args: maxlen, a fresh
# epoch, and ``epoch=rev;...``, the highest revision this publisher saw in each epoch it knows.
# ``epoch(argv)`` returns the store's epoch, setting the fresh one when there is none or when the
# counter is below what this publisher saw in that epoch. ``apply(args, epoch)`` takes the header
# args, then id/json pairs (json "" means delete) and returns a flat list: the epoch, then id, rev
# for every id that actually changed.
_APPLY_FUNCTION = """
local function epoch(argv)
  local current = redis.call('HGET', KEYS[5], 'epoch')
  local counter = tonumber(redis.call('GET', KEYS[4]) or '0')
  local rotate = not current
  if current then
    for seen, rev in string.gmatch(argv[3], '([^=;]+)=(%d+)') do
      if seen == current and counter < tonumber(rev) then
        rotate = true
      end
    end
  end
  if rotate then
    current = argv[2]
    redis.call('HSET', KEYS[5], 'epoch', current)
  end
  return current
end
local function apply(args, ep)
  local out = {ep}
  local maxlen = args[1]
  for i = 4, #args, 2 do
    local id = args[i]
    local cfg = args[i + 1]
    local cur = redis.call('HGET', KEYS[1], id)
    local op = nil
    if cfg == '' then
      if cur then op = 'delete' end
    elseif cur ~= cfg then
      op = 'upsert'
    end
    if op then
      local rev = redis.call('INCR', KEYS[4])
      if op == 'delete' then
        redis.call('HDEL', KEYS[1], id)
      else
        redis.call('HSET', KEYS[1], id, cfg)
      end
      redis.call('HSET', KEYS[2], id, rev)
      redis.call('XADD', KEYS[3], 'MAXLEN', '~', maxlen, '*',
                 'op', op, 'id', id, 'rev', rev, 'config', cfg, 'epoch', ep)
      out[#out + 1] = id
      out[#out + 1] = rev
    end
  end
  return out
end
"""

_APPLY_SCRIPT = _APPLY_FUNCTION + "return apply(ARGV, epoch(ARGV))\n"

# ARGV: the header args, id/json pairs of the desired set: every stored id not in it is deleted
# first.
_REPLACE_SCRIPT = (
    _APPLY_FUNCTION
    + """
local desired = {}
for i = 4, #ARGV, 2 do
  desired[ARGV[i]] = true
end
local args = {ARGV[1], ARGV[2], ARGV[3]}
local ids = redis.call('HKEYS', KEYS[1])
table.sort(ids)
for _, id in ipairs(ids) do
  if not desired[id] then
    args[#args + 1] = id
    args[#args + 1] = ''
  end
end
for i = 4, #ARGV do
  args[#args + 1] = ARGV[i]
end
return apply(args, epoch(ARGV))
"""
)


class StoreError(Exception):
    """Base of the config store's errors."""


class InvalidConfigIdError(StoreError, ValueError):
    """An id that is not ``namespace/name``."""


@runtime_checkable
class CanonicalConfig(Protocol):
    """Anything with a byte-stable canonical JSON form (``StunnerConfig``)."""

    def canonical_json(self) -> str: ...


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a write changed: ``changes`` maps each changed id to its new revision.

    ``epoch`` is the store's epoch the revisions belong to.
    """

    changes: Mapping[str, int]
    epoch: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    @property
    def rev(self) -> int | None:
        return max(self.changes.values()) if self.changes else None


def split_config_id(config_id: str) -> tuple[str, str]:
    """``"ns/name"`` -> ``("ns", "name")``; anything else raises ``InvalidConfigIdError``."""
    namespace, sep, name = config_id.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise InvalidConfigIdError(f"config id must be 'namespace/name', got {config_id!r}")
    return namespace, name


def canonical_text(config: CanonicalConfig | str | Mapping[str, object]) -> str:
    """The text stored in the hash: ``canonical_json()``, or JSON re-encoded sorted and compact."""
    if isinstance(config, CanonicalConfig):
        return config.canonical_json()
    if isinstance(config, str):
        try:
            data = json.loads(config)
        except json.JSONDecodeError as exc:
            raise StoreError(f"config is not valid JSON: {exc}") from exc
    else:
        data = dict(config)
    if not isinstance(data, dict):
        raise StoreError(f"config must be a JSON object, got {type(data).__name__}")
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ConfigPublisher:
    """Writes rendered configs to Redis for the CDS (the operator's only Redis writer)."""

    def __init__(
        self, redis: aioredis.Redis, *, stream_maxlen: int = DEFAULT_STREAM_MAXLEN
    ) -> None:
        if stream_maxlen < 1:
            raise ValueError(f"stream_maxlen must be positive, got {stream_maxlen}")
        self._redis = redis
        self._maxlen = stream_maxlen
        self._apply = redis.register_script(_APPLY_SCRIPT)
        self._replace = redis.register_script(_REPLACE_SCRIPT)
        self._keys = [CONFIGS_HASH, REVS_HASH, EVENTS_STREAM, REV_COUNTER, META_HASH]
        # The highest revision this publisher saw in each epoch (the newest few): a store found
        # in one of them below it was rolled back, and the script gives it a new epoch.
        self._known: dict[str, int] = {}

    async def upsert(
        self, config_id: str, config: CanonicalConfig | str | Mapping[str, object]
    ) -> PublishResult:
        """Store ``config`` under ``config_id``; a no-op if its canonical JSON is unchanged."""
        split_config_id(config_id)
        return await self._run(self._apply, [config_id, canonical_text(config)])

    async def delete(self, config_id: str) -> PublishResult:
        """Remove ``config_id``; a no-op if it is not stored."""
        split_config_id(config_id)
        return await self._run(self._apply, [config_id, ""])

    async def replace_all(
        self, configs: Mapping[str, CanonicalConfig | str | Mapping[str, object]]
    ) -> PublishResult:
        """Make the store hold exactly ``configs``: changed ones upserted, missing ones deleted."""
        args: list[str] = []
        for config_id in sorted(configs):
            split_config_id(config_id)
            args += [config_id, canonical_text(configs[config_id])]
        return await self._run(self._replace, args)

    async def _run(self, script: object, args: list[str]) -> PublishResult:
        known = ";".join(f"{epoch}={rev}" for epoch, rev in self._known.items())
        header = [str(self._maxlen), new_epoch(), known]
        raw = await script(keys=self._keys, args=[*header, *args])  # type: ignore[operator]
        epoch = _text(raw[0])
        changes: dict[str, int] = {}
        for i in range(1, len(raw), 2):
            changes[_text(raw[i])] = int(raw[i + 1])
        result = PublishResult(changes, epoch)
        seen = max(self._known.pop(epoch, 0), result.rev or 0)
        self._known[epoch] = seen  # newest last
        while len(self._known) > KNOWN_EPOCHS:
            del self._known[next(iter(self._known))]
        return result


def new_epoch() -> str:
    """A fresh epoch id: 64 random bits in hex."""
    return secrets.token_hex(8)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
