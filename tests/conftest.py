"""Fixtures shared by every suite. Helpers live in tests/support/."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from support.leaks import assert_no_leaked_tasks
from support.ports import default_ports_held
from support.redis_server import RedisServer, redis_server


@pytest.fixture(scope="session", autouse=True)
def _default_ports_taken() -> Iterator[None]:
    """Tests never use a fixed port: under CI (``CI`` set, as `.ci/run` does) the services'
    default ports are held for the whole run, so a server a test starts without port 0 or a free
    port fails there as it would beside `make run`. On a developer's machine they are left free:
    `make run` must still start while a test run is going on.
    """
    if not os.environ.get("CI") and not os.environ.get("STUNNER_TEST_HOLD_DEFAULT_PORTS"):
        yield
        return
    with default_ports_held():
        yield


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, stopped (by PID) after the test."""
    with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail the test if it leaves asyncio tasks running. Request it first in async tests."""
    before = set(asyncio.all_tasks())
    yield
    await assert_no_leaked_tasks(before)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A command's ``main`` run in-process replaces the root handlers; put them back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
