"""Fixtures of the stunnerd unit tests (sans-IO: no sockets, no sleeps)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.stun import aioice_knows_turn_attributes


@pytest.fixture
def aioice_turn_attributes() -> Iterator[None]:
    """The test's aioice client builds and parses TURN's extra attributes (this test only)."""
    with aioice_knows_turn_attributes():
        yield
