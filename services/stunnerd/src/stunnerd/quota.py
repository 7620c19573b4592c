"""The cluster-wide user quota: `admin.user_quota` counted in Redis across stunnerd replicas.

Upstream counts a user's allocations per pod, so its quota multiplies with the replicas. Here
every allocation holds a *lease* in Redis: a sorted set per (Gateway, realm, user) whose members
are lease ids scored by their expiry (Redis' own clock). One Lua script drops expired leases,
counts the rest and adds the new one atomically, so the quota holds whichever replica an
Allocate reaches. A lease expires with its allocation (plus `grace_s`), a Refresh extends it and
a deletion removes it; a replica that crashes leaves leases that run out within one lifetime.
With `lease_s` set, leases are shorter than the allocations and one background task renews the
live ones every `lease_s / 2` in a single pipeline, so a crashed replica's slots return sooner.

Redis is only called at Allocate, Refresh and deletion, never per packet, always under a
timeout and never on the event loop's critical path (the Allocate waits, the listener does
not). When Redis cannot be reached, each replica enforces its share, `limit // replicas` (at
least 1), on the leases it holds itself, says so in `/status`, and tries Redis again after
`retry_s`. Once it answers again, each replica writes its live leases back before its next
Allocate (and, with `lease_s`, at its next renewal): a Redis that restarted empty undercounts
until every replica has done so.

The scope is one Gateway (the config's `admin.name`): upstream's quota is a setting of each
Gateway's dataplane config, and stunnerd cannot tell which GatewayConfig its config came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import socket
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from stunner_common.contracts.redis_keys import QuotaKey
from stunnerd.bounds import Ge, Gt

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(__name__)


_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
    return {0, redis.call('ZCARD', KEYS[1])}
  end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.floor(tonumber(last[2])))
return {1, redis.call('ZCARD', KEYS[1])}
"""
"""KEYS[1] the user's set; ARGV limit, lease id, lease ms. Returns {granted, leases held}."""

_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.floor(tonumber(last[2])))
return 1
"""
"""KEYS[1] the user's set; ARGV lease id, lease ms. Re-adds a lease Redis lost, no limit check:
the allocation exists already."""


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """Where the shared count lives and how a replica behaves without it."""

    redis_url: str = ""
    """Count `admin.user_quota` across replicas in this Redis (`redis://user:pass@host:port/0`);
    empty: each process counts its own allocations, as upstream."""
    replicas: Annotated[int, Ge(1)] = 1
    """How many replicas share the Gateway: each one's share without Redis is limit // this."""
    timeout_s: Annotated[float, Gt(0)] = 0.5
    """How long one Redis call may take."""
    retry_s: Annotated[float, Gt(0)] = 5.0
    """After Redis failed, how long each replica stays on its share before trying it again."""
    lease_s: Annotated[float, Ge(0)] = 0.0
    """0: a lease lasts as long as its allocation; otherwise this long, renewed in background."""
    grace_s: Annotated[float, Ge(0)] = 2.0
    """Added to every lease, for the time between Redis' clock and the allocation's."""

    def to_worker_json(self) -> str:
        """Everything but the URL (it may hold a password): a worker reads that from the
        `STUNNERD_QUOTA_REDIS_URL` it inherits."""
        return json.dumps(
            {
                "replicas": self.replicas,
                "timeout_s": self.timeout_s,
                "retry_s": self.retry_s,
                "lease_s": self.lease_s,
                "grace_s": self.grace_s,
            }
        )

    @classmethod
    def from_worker_json(cls, text: str, redis_url: str) -> QuotaSettings:
        return cls(redis_url, **json.loads(text))


@dataclass(slots=True)
class _Lease:
    user_id: str
    lifetime_s: float


class ClusterQuota:
    """One process's view of the shared quota; listeners ask it before opening a relay."""

    def __init__(self, settings: QuotaSettings, replica_id: str | None = None) -> None:
        self.settings = settings
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}"
        # redis (about 10 MiB) is imported only by a process that has a quota to count.
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError

        self._errors: tuple[type[Exception], ...] = (RedisError, OSError, TimeoutError)
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            settings.redis_url,
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
        )
        self._acquire_script = self._redis.register_script(_ACQUIRE)
        self._renew_script = self._redis.register_script(_RENEW)
        self.limit = 0
        self.scope = ""
        self.realm = ""
        self._live: dict[str, _Lease] = {}  # this process's leases
        self._held: dict[str, int] = {}  # leases per user, for the local share
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self.degraded_reason: str | None = None
        self._retry_at = 0.0
        self._resync = False
        self.refused = 0

    # ------------------------------------------------------------------ config

    def configure(self, scope: str, realm: str, limit: int) -> None:
        """The running config's Gateway id, realm and `admin.user_quota` (0: no quota)."""
        if (scope, realm) != (self.scope, self.realm):
            self._live.clear()  # leases of another Gateway's config: not ours to count
            self._held.clear()
        self.scope, self.realm, self.limit = scope, realm, max(0, limit)

    @property
    def enforcing(self) -> bool:
        return self.limit > 0

    @property
    def share(self) -> int:
        """What this replica may hold per user while Redis is away."""
        return max(1, self.limit // max(1, self.settings.replicas))

    def lease_id(self, listener: str, client: tuple[str, int]) -> str:
        return f"{self.replica_id}|{listener}|{client[0]}:{client[1]}|{next(self._ids)}"

    def _key(self, user_id: str) -> str:
        return QuotaKey(self.scope, self.realm, user_id).encode()

    def _lease_ms(self, lifetime_s: float) -> int:
        length = lifetime_s
        if self.settings.lease_s > 0:
            length = min(length, self.settings.lease_s)
        return math.ceil((length + self.settings.grace_s) * 1000)

    def held(self, user_id: str) -> int:
        return self._held.get(user_id, 0)

    def _hold(self, lease: str, user_id: str, lifetime_s: float) -> None:
        self._live[lease] = _Lease(user_id, lifetime_s)
        self._held[user_id] = self._held.get(user_id, 0) + 1

    def _unhold(self, lease: str) -> _Lease | None:
        held = self._live.pop(lease, None)
        if held is not None:
            left = self._held.get(held.user_id, 0) - 1
            if left > 0:
                self._held[held.user_id] = left
            else:
                self._held.pop(held.user_id, None)
        return held

    # ------------------------------------------------------------------ Redis state

    def _redis_usable(self) -> bool:
        return self.degraded_reason is None or asyncio.get_running_loop().time() >= self._retry_at

    def _failed(self, exc: BaseException) -> None:
        reason = f"redis unreachable: {exc or type(exc).__name__}"
        if self.degraded_reason is None:
            log.warning(
                "user quota: %s; each replica now admits its share (%d of %d per user)",
                reason,
                self.share,
                self.limit,
            )
        self.degraded_reason = reason
        self._retry_at = asyncio.get_running_loop().time() + self.settings.retry_s
        self._resync = True

    def _recovered(self) -> None:
        if self.degraded_reason is not None:
            log.warning("user quota: redis answers again; the quota is cluster-wide again")
        self.degraded_reason = None
        if self._resync:
            self._spawn(self._renew_all(), "quota-resync")

    async def _call(self, coro: Awaitable[Any]) -> Any:
        async with asyncio.timeout(self.settings.timeout_s):
            return await coro

    # ------------------------------------------------------------------ API

    async def acquire(self, user_id: str, lease: str, lifetime_s: float) -> bool:
        """May `user_id` have one more allocation? On yes, `lease` is held until released."""
        if not self.enforcing:
            self._hold(lease, user_id, lifetime_s)
            return True
        if self._redis_usable() and self._resync:
            await self._renew_all()  # Redis was away: count our own leases there first
        if self._redis_usable():
            try:
                granted, _count = await self._call(
                    self._acquire_script(
                        keys=[self._key(user_id)],
                        args=[self.limit, lease, self._lease_ms(lifetime_s)],
                    )
                )
            except self._errors as exc:
                self._failed(exc)
            else:
                self._recovered()
                if not int(granted):
                    self.refused += 1
                    return False
                self._hold(lease, user_id, lifetime_s)
                self._ensure_renewer()
                return True
        if self.held(user_id) >= self.share:
            self.refused += 1
            return False
        self._hold(lease, user_id, lifetime_s)
        return True

    def renew(self, lease: str, lifetime_s: float) -> None:
        """A Refresh extended the allocation: extend its lease (in the background)."""
        held = self._live.get(lease)
        if held is None:
            return
        held.lifetime_s = lifetime_s
        if self.enforcing and self._redis_usable():
            self._spawn(self._renew_one(lease, held), "quota-renew")

    def release(self, lease: str) -> None:
        """The allocation is gone (or never came to be): free its slot (in the background)."""
        held = self._unhold(lease)
        if held is not None and self.enforcing and self._redis_usable():
            self._spawn(self._release_one(lease, held.user_id), "quota-release")

    def status(self) -> dict[str, Any]:
        """The `/status` entry: where the quota is counted right now, and why."""
        if not self.enforcing:
            return {"limit": 0, "mode": "off"}
        doc: dict[str, Any] = {
            "limit": self.limit,
            "scope": self.scope,
            "replicas": self.settings.replicas,
            "leases": len(self._live),
            "refused": self.refused,
        }
        if self.degraded_reason is None:
            doc["mode"] = "cluster"
        else:
            doc["mode"] = "local-share"
            doc["share"] = self.share
            doc["reason"] = self.degraded_reason
        return doc

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(
            *self._tasks, *([self._renewer] if self._renewer else []), return_exceptions=True
        )
        with contextlib.suppress(*self._errors):
            await self._redis.aclose()

    # ------------------------------------------------------------------ background

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew_one(self, lease: str, held: _Lease) -> None:
        try:
            await self._call(
                self._renew_script(
                    keys=[self._key(held.user_id)], args=[lease, self._lease_ms(held.lifetime_s)]
                )
            )
        except self._errors as exc:
            self._failed(exc)
        else:
            self._recovered()

    async def _release_one(self, lease: str, user_id: str) -> None:
        try:
            await self._call(self._redis.zrem(self._key(user_id), lease))
        except self._errors as exc:
            self._failed(exc)  # the lease runs out by itself

    async def _renew_all(self) -> None:
        """Write every live lease again (after Redis was away, and with short leases)."""
        self._resync = False
        if not self._live or not self.enforcing:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for lease, held in list(self._live.items()):
                    await self._renew_script(
                        keys=[self._key(held.user_id)],
                        args=[lease, self._lease_ms(held.lifetime_s)],
                        client=pipe,
                    )
                await self._call(pipe.execute())
        except self._errors as exc:
            self._failed(exc)
        else:
            self._recovered()

    def _ensure_renewer(self) -> None:
        if self.settings.lease_s > 0 and self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_loop(), name="quota-lease-renewer"
            )

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 2)
            if self._redis_usable():
                await self._renew_all()
