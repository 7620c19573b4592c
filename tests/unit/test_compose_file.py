"""docker-compose.yml keeps every server on loopback, as `make run` does.

The stack runs on the host network, so a service that binds the wildcard address is reachable
from the whole network: each one is told 127.0.0.1 (flags or environment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    assert isinstance(services, dict)
    return services


def test_the_operator_serves_health_and_metrics_on_loopback() -> None:
    command = [str(x) for x in _compose()["operator"]["command"]]
    for flag in ("--health-address", "--metrics-address"):
        assert flag in command, command
        assert command[command.index(flag) + 1].startswith("127.0.0.1:"), command


def test_no_service_binds_the_wildcard_address() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "0.0.0.0" not in text
    services = _compose()
    assert services["auth"]["environment"]["AUTH_HOST"] == "127.0.0.1"
    for name in ("stunnerd-udp-gateway", "stunnerd-tcp-gateway"):
        assert services[name]["environment"]["STUNNERD_BIND_HOST"] == "127.0.0.1"


def test_each_stunnerd_has_a_metrics_port_of_its_own() -> None:
    services = _compose()
    ports = {
        services[name]["environment"]["STUNNERD_METRICS_PORT"]
        for name in ("stunnerd-udp-gateway", "stunnerd-tcp-gateway")
    }
    assert len(ports) == 2
    assert not any("8080" in port for port in ports), "the operator's metrics port"
