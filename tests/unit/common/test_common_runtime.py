"""Event-loop start-up: uvloop when installed and preferred, asyncio's loop otherwise."""

from __future__ import annotations

import asyncio

import pytest

from stunner_common.runtime import loop_factory, run


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_run_uses_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    assert run(_loop_module()).startswith("uvloop")


def test_run_uses_asyncio_when_uvloop_is_not_wanted() -> None:
    assert loop_factory(prefer_uvloop=False) is None
    assert run(_loop_module(), prefer_uvloop=False).startswith("asyncio")


def test_run_returns_the_result_and_raises_the_error() -> None:
    async def boom() -> None:
        raise LookupError("x")

    with pytest.raises(LookupError):
        run(boom())
