"""Fixtures of the operator's integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from stunner_operator.k8s.api import KubeApi
from stunner_operator.k8s.leader import LEASE


@pytest.fixture
async def api() -> AsyncIterator[KubeApi]:
    """A client of kmock's emulated API server that serves Leases."""
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        emulator.resources[f"{LEASE.api_version}/{LEASE.plural}"] = {}  # type: ignore[assignment]
        client = KubeApi(ApiClient(Configuration(host=str(emulator.url).rstrip("/"))))
        try:
            yield client
        finally:
            await client.aclose()
