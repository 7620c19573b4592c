"""The file origin follows every way a config file changes on disk, and skips bad states."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stunner_common.config import StunnerConfig
from stunnerd.origin.base import ConfigEvent, ConfigOriginError
from stunnerd.origin.file import FileOrigin

pytestmark = pytest.mark.integration

STEP_TIMEOUT_S = 5.0


def config_text(realm: str, port: int = 3478) -> str:
    return f"""
version: v1
admin: {{name: ns/gw}}
auth:
  type: static
  realm: {realm}
  credentials: {{username: user, password: pass}}
listeners:
  - {{name: udp, protocol: TURN-UDP, address: "$STUNNER_ADDR", port: {port}, routes: [echo]}}
clusters:
  - {{name: echo, type: STATIC, endpoints: ["127.0.0.1"]}}
"""


def replace_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Watch:
    def __init__(self, origin: FileOrigin) -> None:
        self.queue: asyncio.Queue[ConfigEvent] = asyncio.Queue()
        self.origin = origin
        self.task = asyncio.create_task(self._run(), name="file-watch")

    async def _run(self) -> None:
        async for event in self.origin.watch():
            await self.queue.put(event)

    async def next(self) -> StunnerConfig:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            return (await self.queue.get()).config

    async def skipped(self, count: int) -> None:
        """Wait until the watcher has looked at and skipped `count` file versions."""
        for _ in range(int(STEP_TIMEOUT_S / 0.01)):
            if self.origin.skipped >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"watcher skipped {self.origin.skipped} versions, want {count}")

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def watch(tmp_path: Path) -> AsyncIterator[tuple[Path, Watch]]:
    path = tmp_path / "stunnerd.conf"
    w = Watch(FileOrigin(path, env={"STUNNER_ADDR": "127.0.0.9"}, poll_interval_s=0.02))
    yield path, w
    await w.close()


async def test_a_missing_file_is_awaited_and_emitted_once_created(
    no_leaked_tasks: None, watch: tuple[Path, Watch]
) -> None:
    path, w = watch
    assert w.queue.empty()
    path.write_text(config_text("one"))
    cfg = await w.next()
    assert cfg.auth.realm == "one"
    assert cfg.listeners[0].address == "127.0.0.9"


async def test_an_atomic_replace_emits_the_new_config(
    no_leaked_tasks: None, watch: tuple[Path, Watch]
) -> None:
    path, w = watch
    replace_atomically(path, config_text("one"))
    assert (await w.next()).auth.realm == "one"
    replace_atomically(path, config_text("two"))
    assert (await w.next()).auth.realm == "two"


async def test_delete_and_recreate_resumes_the_watch(
    no_leaked_tasks: None, watch: tuple[Path, Watch]
) -> None:
    path, w = watch
    path.write_text(config_text("one"))
    assert (await w.next()).auth.realm == "one"
    path.unlink()
    path.write_text(config_text("three"))
    assert (await w.next()).auth.realm == "three"


async def test_empty_and_invalid_content_is_skipped_and_the_next_valid_one_emitted(
    no_leaked_tasks: None, watch: tuple[Path, Watch]
) -> None:
    path, w = watch
    path.write_text(config_text("one"))
    assert (await w.next()).auth.realm == "one"
    path.write_text("")
    await w.skipped(1)
    path.write_text(config_text("bad").replace("TURN-UDP", "dummy"))
    await w.skipped(2)
    path.write_text(config_text("four"))
    assert (await w.next()).auth.realm == "four"
    assert w.queue.empty()


async def test_rewriting_the_same_config_emits_nothing_new(
    no_leaked_tasks: None, watch: tuple[Path, Watch]
) -> None:
    path, w = watch
    path.write_text(config_text("one"))
    assert (await w.next()).auth.realm == "one"
    replace_atomically(path, config_text("one"))
    path.write_text(config_text("five"))
    assert (await w.next()).auth.realm == "five"


async def test_a_one_shot_load_of_an_invalid_file_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.conf"
    path.write_text(config_text("x").replace("TURN-UDP", "dummy"))
    with pytest.raises(ConfigOriginError, match="invalid config file"):
        await FileOrigin(path).load()
    with pytest.raises(ConfigOriginError, match="cannot read"):
        await FileOrigin(tmp_path / "missing.conf").load()
