"""Fixtures of the unit tests of stunnerd's network edge: a fake loop and fake relay ports."""

from __future__ import annotations

import pytest

from support.fake_listeners import RelayPorts
from support.fake_net import MockLoop


@pytest.fixture
def loop() -> MockLoop:
    return MockLoop()


@pytest.fixture
def ports() -> RelayPorts:
    return RelayPorts()
