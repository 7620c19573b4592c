"""Fixtures of the unit tests of stunnerd's network edge: a fake loop, fake relay ports and a
self-signed certificate for the TLS and DTLS listeners."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stunner_common.config import TlsPair, load_tls_pair, self_signed_pair
from support.fake_listeners import RelayPorts
from support.fake_net import MockLoop


@pytest.fixture
def loop() -> Iterator[MockLoop]:
    """The fake loop; a test that leaves one of its tasks unfinished fails."""
    loop = MockLoop()
    yield loop
    loop.run_ready()
    assert [task.get_name() for task in loop.tasks if not task.done()] == []


@pytest.fixture
def ports() -> RelayPorts:
    return RelayPorts()


@pytest.fixture(scope="session")
def pair() -> TlsPair:
    return load_tls_pair(*self_signed_pair("127.0.0.1"))
