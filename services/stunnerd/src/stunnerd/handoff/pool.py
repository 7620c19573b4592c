"""Hot handoff between two multi-process stunnerds: the supervisor already holds what it takes.

The old supervisor (`PoolHandoffSource`) freezes its workers (requests are left to the next
process), reads what they journaled last and offers the nonce key, every listener's SO_REUSEPORT
group (each member in worker order) and each worker's live allocations with their relay sockets.
The new supervisor (`seed`) puts the groups into its `SocketGroups` and the allocations into its
workers' journals before any worker starts serving, so each worker adopts its predecessor's
allocations with its first config (`WorkerPool._apply_one`), on the very socket the kernel
steers those clients to. Both must run the same number of workers: the SO_REUSEPORT hash maps a
client to the member of the same index.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Sequence
from typing import Any

from stunner_common.contracts.socket_key import SocketKey
from stunner_common.contracts.worker_messages import DoneReply, FreezeRequest
from stunnerd.handoff.transport.channel import HandoffRefusedError, Offer
from stunnerd.handoff.transport.records import record_bytes
from stunnerd.handoff.transport.state import FORMAT, VERSION, HandoffState, allocation_doc
from stunnerd.workers.pool import WorkerPool
from stunnerd.workers.worker import WorkerError


class PoolHandoffSource:
    """The old side of a handoff in worker mode."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    async def _freeze(self, frozen: bool) -> None:
        async def one(index: int) -> None:
            with contextlib.suppress(WorkerError):
                worker = self.pool.workers[index]
                await worker.request(FreezeRequest(frozen), DoneReply, 5.0)

        await asyncio.gather(*(one(i) for i in range(len(self.pool.workers))))

    async def prepare(self, readable: Sequence[int]) -> Offer:
        if VERSION not in readable:
            raise HandoffRefusedError(
                f"this stunnerd writes state version {VERSION}; the new one reads "
                f"{', '.join(map(str, sorted(readable))) or 'none'}: keeping on serving"
            )
        pool = self.pool
        await self._freeze(True)
        sockets: list[list[Any]] = []
        fds: list[int] = []
        for key in sorted(pool.sockets.groups):
            for member in pool.sockets.groups[key]:
                sockets.append([key.kind, key.host, key.port])
                fds.append(member.fileno())
        names = [lst.name for lst in pool.running.listeners] if pool.running is not None else []
        listeners: list[dict[str, Any]] = []
        for worker in pool.workers:
            if worker.channel is not None:
                worker.journal.read(worker.channel)  # what it journaled before it froze
            docs, relays = worker.journal.live(names, worker.index)
            listeners += docs
            fds += relays
        document = {
            "format": FORMAT,
            "version": VERSION,
            "nonce_key": pool.nonce_key.hex(),
            "sockets": sockets,
            "workers": len(pool.workers),
            "listeners": listeners,
        }
        data = json.dumps(document, separators=(",", ":")).encode()
        return Offer(data, VERSION, fds, lambda: self._freeze(False), self._release)

    async def _release(self) -> None:
        self.pool.offload.let_go()  # the successor's program replaced ours: leave it attached


def seed(
    pool: WorkerPool,
    state: HandoffState,
    listener_socks: Sequence[socket.socket],
    relay_socks: Sequence[socket.socket],
) -> None:
    """Give a new pool, before it starts, the groups and allocations a handoff brought.

    Raises ValueError when the old process ran another number of workers.
    """
    if state.workers != len(pool.workers):
        raise ValueError(
            f"the running stunnerd has {state.workers or 1} worker process(es), this one "
            f"{len(pool.workers)}: start it with the same --udp-thread-num"
        )
    for bound, sock in zip(state.sockets, listener_socks, strict=True):
        key = SocketKey(bound.kind, bound.host, bound.port)
        pool.sockets.groups.setdefault(key, []).append(sock)
    if any(len(group) != len(pool.workers) for group in pool.sockets.groups.values()):
        raise ValueError("a listener's socket group does not have one socket per worker")
    relays = iter(relay_socks)
    now = time.monotonic()
    for lst in state.listeners:
        journal = pool.workers[lst.worker].journal
        for record in lst.allocations:
            count = 1 if record.additional is None else 2
            fds = [next(relays).detach() for _ in range(count)]
            journal.keep(lst.name, record.client, now, record_bytes(allocation_doc(record)), fds)
