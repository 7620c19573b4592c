"""The one way to write configs into Redis: atomic, numbered, and silent when nothing changed.

Every change is a Lua script that compares the canonical JSON already stored, and only when it
differs increments ``stunner:rev``, writes the hash, records the revision in ``stunner:revs`` and
appends the stream entry — all in one atomic step, so a reader never sees a hash write without its
event or two changes with one revision. ``replace_all`` applies a whole desired set in one script.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import redis.asyncio as aioredis

from stunner_common.redis_keys import CONFIGS_HASH, EVENTS_STREAM, REV_COUNTER

REVS_HASH = "stunner:revs"
"""Hash: field ``ns/name`` -> revision of its last change (upsert or delete)."""

DEFAULT_STREAM_MAXLEN = 10_000
"""Approximate length the change stream is trimmed to (``XADD MAXLEN ~``)."""

# KEYS: configs, revs, stream, counter. ``apply(args)`` takes maxlen, then id/json pairs (json ""
# means delete) and returns a flat list of id, rev for every id that actually changed.
_APPLY_FUNCTION = """
local function apply(args)
  local out = {}
  local maxlen = args[1]
  for i = 2, #args, 2 do
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
                 'op', op, 'id', id, 'rev', rev, 'config', cfg)
      out[#out + 1] = id
      out[#out + 1] = rev
    end
  end
  return out
end
"""

_APPLY_SCRIPT = _APPLY_FUNCTION + "return apply(ARGV)\n"

# ARGV: maxlen, id/json pairs of the desired set: every stored id not in it is deleted first.
_REPLACE_SCRIPT = (
    _APPLY_FUNCTION
    + """
local desired = {}
for i = 2, #ARGV, 2 do
  desired[ARGV[i]] = true
end
local args = {ARGV[1]}
local ids = redis.call('HKEYS', KEYS[1])
table.sort(ids)
for _, id in ipairs(ids) do
  if not desired[id] then
    args[#args + 1] = id
    args[#args + 1] = ''
  end
end
for i = 2, #ARGV do
  args[#args + 1] = ARGV[i]
end
return apply(args)
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
    """What a write changed: ``changes`` maps each changed id to its new revision."""

    changes: Mapping[str, int]

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
        self._keys = [CONFIGS_HASH, REVS_HASH, EVENTS_STREAM, REV_COUNTER]

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
        raw = await script(keys=self._keys, args=[str(self._maxlen), *args])  # type: ignore[operator]
        changes: dict[str, int] = {}
        for i in range(0, len(raw), 2):
            key = raw[i]
            changes[key.decode() if isinstance(key, bytes) else str(key)] = int(raw[i + 1])
        return PublishResult(changes)
