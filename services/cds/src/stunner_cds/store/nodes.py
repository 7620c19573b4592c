"""The Node addresses the CDS fills the node-address placeholder with (relay address discovery).

The operator writes each Node's external address to the Redis hash `NODE_ADDRESSES_HASH`; a
client that names its node (`?node=<STUNNER_NODENAME>`) gets its listeners' placeholder address
replaced with that Node's address, as upstream's CDS does. This module keeps a copy of the hash,
read again every `refresh_s` by one task (never per request), which also resolves the names of
Nodes that have only an ExternalDNS. A Node with no address (or a name that does not resolve),
or no copy yet, leaves the placeholder to `$STUNNER_ADDR` (the pod's address) as before.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from stunner_common.contracts.redis_keys import NODE_ADDRESSES_HASH, decode_node_addresses

log = logging.getLogger(__name__)

REFRESH_S = 2.0

_addresses: dict[str, str] = {}


def node_address(node: str | None) -> str | None:
    """The external address of `node` as last read from Redis, or None."""
    return _addresses.get(node) if node else None


async def _resolve(name: str, timeout_s: float) -> str | None:
    """A Node's ExternalDNS name to its first address (upstream's CDS does the same)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
    except (OSError, TimeoutError) as exc:
        log.debug("node address %s does not resolve: %s", name, exc)
        return None
    return str(infos[0][4][0]) if infos else None


async def refresh(redis: aioredis.Redis, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        raw = await redis.hgetall(NODE_ADDRESSES_HASH)
    fresh: dict[str, str] = {}
    for node, address in decode_node_addresses(raw).items():
        try:
            ipaddress.ip_address(address)
        except ValueError:
            resolved = await _resolve(address, timeout_s)
            if resolved is None:
                continue
            address = resolved
        fresh[node] = address
    if fresh != _addresses:
        _addresses.clear()
        _addresses.update(fresh)
        log.info("node addresses for relay address discovery: %d node(s)", len(fresh))


async def follow(redis: aioredis.Redis, timeout_s: float, refresh_s: float = REFRESH_S) -> None:
    """Keep the copy of the node addresses fresh until cancelled (the previous copy is kept
    while Redis is unreachable)."""
    while True:
        try:
            await refresh(redis, timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            log.debug("node addresses: cannot read Redis: %s", exc)
        await asyncio.sleep(refresh_s)
