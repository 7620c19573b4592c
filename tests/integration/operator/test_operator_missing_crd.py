"""An operator started on a cluster without the Gateway API CRDs says which one to install."""

from __future__ import annotations

import asyncio
import logging
import ssl

import kmock
import pytest

from stunner_common.io.kube.api import KubeApi
from stunner_common.io.kube.config import KubeAccess
from stunner_operator.controller.loops import ControllerOptions, KubeController
from stunner_operator.k8s.resources import WATCHED
from stunner_operator.publish import RedisConfigSink
from support.redis_server import RedisServer

RESOURCES = tuple(r for r in WATCHED if r.kind != "Namespace")


async def test_a_missing_gateway_api_crd_is_named_once_with_how_to_install_it(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        for res in RESOURCES:
            if not res.optional and res.kind != "GatewayClass":
                emulator.resources[f"{res.api_version}/{res.plural}"] = {}  # type: ignore[assignment]
        api = KubeApi(
            KubeAccess(str(emulator.url).rstrip("/"), ssl.create_default_context()), timeout_s=5
        )
        sink = RedisConfigSink(redis.url, timeout_s=2)
        ctl = KubeController(api, sink, ControllerOptions(retry_s=0.05, resources=RESOURCES))
        stop = asyncio.Event()
        with caplog.at_level(logging.ERROR, logger="stunner_operator.controller.loops"):
            named = asyncio.Event()
            handler = logging.Handler()
            handler.emit = lambda record: named.set()  # type: ignore[method-assign]
            logging.getLogger("stunner_operator.controller.loops").addHandler(handler)
            try:
                task = asyncio.create_task(ctl.run(stop), name="kube-controller")
                async with asyncio.timeout(10):
                    await named.wait()
                await asyncio.sleep(0.5)  # ten more retries of the missing list: no repeat
            finally:
                logging.getLogger("stunner_operator.controller.loops").removeHandler(handler)
            stop.set()
            async with asyncio.timeout(10):
                await task
        await sink.aclose()
        await api.aclose()
    messages = [r.getMessage() for r in caplog.records if "does not serve" in r.getMessage()]
    assert len(messages) == 1, messages
    assert "gatewayclasses.gateway.networking.k8s.io" in messages[0]
    assert "gateway-api/releases/download" in messages[0]
    assert not ctl.synced.is_set()
