"""GatewayConfig ``userQuota`` from YAML reaches stunnerd: the 3rd allocation over a quota of 2
gets 486 (Allocation Quota Reached) from a real server, asked by aioice (an independent client)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from aioice.stun import TransactionFailed
from aioice.turn import TurnTransport, create_turn_endpoint
from fixtures.stunnerd.inproc import running_server

from stunner_common.config import parse_config
from stunner_operator.manifests.local import LocalOperator
from support.ports import free_udp_tcp_port

pytestmark = [pytest.mark.integration, pytest.mark.interop, pytest.mark.timeout(60)]

MANIFESTS = """
apiVersion: stunner.l7mp.io/v1
kind: Dataplane
metadata: {{name: default}}
spec: {{image: l7mp/stunnerd:latest}}
---
apiVersion: stunner.l7mp.io/v1
kind: GatewayConfig
metadata: {{name: stunner-gatewayconfig, namespace: stunner}}
spec:
  realm: stunner.l7mp.io
  authType: static
  userName: user-1
  password: pass-1
  userQuota: {quota}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: stunner-gatewayclass}}
spec:
  controllerName: "stunner.l7mp.io/gateway-operator"
  parametersRef:
    group: "stunner.l7mp.io"
    kind: GatewayConfig
    namespace: stunner
    name: stunner-gatewayconfig
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: udp-gateway, namespace: stunner}}
spec:
  gatewayClassName: stunner-gatewayclass
  addresses: [{{type: IPAddress, value: 127.0.0.1}}]
  listeners:
    - name: udp-listener
      port: {port}
      protocol: TURN-UDP
"""


class _Sink(asyncio.DatagramProtocol):
    def datagram_received(self, data: bytes, addr: Any) -> None:
        pass


def rendered_config(tmp_path: Path, quota: int, port: int) -> dict[str, Any]:
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "stunner.yaml").write_text(MANIFESTS.format(quota=quota, port=port))
    operator = LocalOperator(folder, None)
    operator.sync()
    assert operator.manifests.errors == []
    (config,) = operator.renderer.configs().values()
    return config.to_dict()


@pytest.mark.parametrize(("quota", "granted"), [(2, 2), (0, 3)])
async def test_user_quota_from_yaml_refuses_the_allocation_over_it_with_486(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_leaked_tasks: None,
    quota: int,
    granted: int,
) -> None:
    port = free_udp_tcp_port()
    raw = rendered_config(tmp_path, quota, port)
    assert raw["admin"]["user_quota"] == quota
    monkeypatch.setenv("STUNNER_ADDR", "127.0.0.1")
    config = parse_config(raw)  # as stunnerd reads it: $STUNNER_ADDR expanded
    turns: list[TurnTransport] = []
    async with running_server(config):
        try:
            for _ in range(granted):
                turn, _proto = await create_turn_endpoint(
                    _Sink, ("127.0.0.1", port), "user-1", "pass-1"
                )
                turns.append(turn)
            if quota:
                with pytest.raises(TransactionFailed) as failed:
                    await create_turn_endpoint(_Sink, ("127.0.0.1", port), "user-1", "pass-1")
                code, _reason = failed.value.response.attributes["ERROR-CODE"]
                assert code == 486
        finally:
            for turn in turns:
                with contextlib.suppress(Exception):
                    turn.close()
            await asyncio.sleep(0.05)
