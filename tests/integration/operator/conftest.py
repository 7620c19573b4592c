"""Fixtures of the operator's integration tests."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import kmock
import pytest

from stunner_common.io.kube.api import KubeApi
from stunner_common.io.kube.config import KubeAccess
from stunner_operator.controller.leader import LEASE


@pytest.fixture
async def api() -> AsyncIterator[KubeApi]:
    """A client of kmock's emulated API server that serves Leases."""
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        emulator.resources[f"{LEASE.api_version}/{LEASE.plural}"] = {}  # type: ignore[assignment]
        client = KubeApi(KubeAccess(str(emulator.url).rstrip("/"), ssl.create_default_context()))
        try:
            yield client
        finally:
            await client.aclose()
