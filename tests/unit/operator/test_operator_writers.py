"""The controller's writers: several objects written at once, one object never twice at once.

A thousand Gateways leave thousands of Service, Deployment and status writes queued; written one
at a time (each waits for etcd), a Gateway added meanwhile waited for all of them. The writers
take the oldest intents in parallel, up to ``ControllerOptions.writers``, and keep each
object's writes in order: a newer intent for an object in flight waits for that write to end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from stunner_common.io.kube.api import KubeApi
from stunner_operator.controller.loops import ControllerOptions, KubeController, _Write

DELAY_S = 0.05


@dataclass
class SlowApi:
    """Records each apply's start and end; a write takes DELAY_S."""

    in_flight: int = 0
    most_in_flight: int = 0
    log: list[tuple[str, str, int]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def apply(self, _resource: Any, body: dict[str, Any]) -> None:
        name, version = body["metadata"]["name"], body["version"]
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.note(("start", name, version))
        await asyncio.sleep(DELAY_S)
        self.note(("end", name, version))
        self.in_flight -= 1

    def note(self, entry: tuple[str, str, int]) -> None:
        self.log.append(entry)
        self.changed.set()

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not check():
                self.changed.clear()
                await self.changed.wait()


def service(name: str, version: int) -> _Write:
    body = {"kind": "Service", "metadata": {"name": name, "namespace": "ns"}, "version": version}
    return _Write("apply", ("Service", "ns", name), body)


async def test_writers_overlap_across_objects_and_keep_each_objects_order() -> None:
    api = SlowApi()
    ctl = KubeController(cast(KubeApi, api), cast(Any, None), ControllerOptions(writers=4))
    writers = [asyncio.create_task(ctl._write_loop()) for _ in range(4)]
    try:
        for i in range(12):
            ctl._queue(service(f"s{i}", 1))
        await api.until(lambda: ("start", "s0", 1) in api.log)
        ctl._queue(service("s0", 2))  # while version 1 of s0 is being written
        await api.until(lambda: len([e for e in api.log if e[0] == "end"]) == 13)
    finally:
        for task in writers:
            task.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
    assert 1 < api.most_in_flight <= 4
    s0 = [(kind, version) for kind, name, version in api.log if name == "s0"]
    assert s0 == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert {name for _, name, _ in api.log} == {f"s{i}" for i in range(12)}


async def test_one_writer_writes_in_the_order_intents_came() -> None:
    api = SlowApi()
    ctl = KubeController(cast(KubeApi, api), cast(Any, None), ControllerOptions(writers=1))
    writer = asyncio.create_task(ctl._write_loop())
    try:
        for i in range(5):
            ctl._queue(service(f"s{i}", 1))
        await api.until(lambda: len(api.log) == 10)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    assert api.most_in_flight == 1
    assert [name for kind, name, _ in api.log if kind == "start"] == [f"s{i}" for i in range(5)]
