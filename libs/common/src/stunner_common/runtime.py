"""Starting a service's event loop: uvloop when it is installed, asyncio's own loop otherwise.

Every command runs its main coroutine through `run`, so the choice is made in one place. uvloop
is a dependency of stunnerd and the CDS (on platforms that have it); without it (or with
``prefer_uvloop=False``) the standard loop runs the same code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["loop_factory", "run"]

T = TypeVar("T")


def loop_factory(prefer_uvloop: bool = True) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when installed and preferred, else None (asyncio's default)."""
    if not prefer_uvloop:
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], *, prefer_uvloop: bool = True) -> T:
    """Run ``main`` to completion on a fresh loop (uvloop when available) and close the loop."""
    with asyncio.Runner(loop_factory=loop_factory(prefer_uvloop)) as runner:
        return runner.run(main)
