"""stunnerctl's pure parts: the summary text, percentiles, where a stunnerd's /status is looked
for, and the Gateway argument."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from stunner_common.config import StunnerConfig, parse_config
from turncat.ctl.main import build_parser, selector
from turncat.ctl.status import LOOPBACK_SLACK, health_urls
from turncat.ctl.summary import config_summary, percentile, probe_summary
from turncat.errors import BadInputError


def config(auth: dict[str, Any], public: str | None = None, **admin: Any) -> StunnerConfig:
    listener: dict[str, Any] = {"public_address": public} if public else {}
    return parse_config(
        json.dumps(
            {
                "version": "v1",
                "admin": {"name": "stunner/gw", **admin},
                "auth": auth,
                "listeners": [
                    {
                        "name": "stunner/gw/udp",
                        "protocol": "TURN-UDP",
                        "address": "$STUNNER_ADDR",
                        "port": 3478,
                        "routes": ["stunner/a", "stunner/b", "stunner/missing"],
                        **listener,
                    }
                ],
                "clusters": [
                    {"name": "stunner/a", "type": "STATIC", "endpoints": ["10.0.0.1"]},
                    {"name": "stunner/b", "type": "STATIC", "endpoints": ["10.0.0.2/32"]},
                ],
            }
        )
    )


def test_summary_of_ephemeral_auth_and_a_listener_without_public_address() -> None:
    text = config({"type": "ephemeral", "credentials": {"secret": "s3cr3t"}})
    assert config_summary(text).splitlines() == [
        'Gateway: stunner/gw (loglevel: "all:INFO")',
        "Authentication type: ephemeral, shared-secret: s3cr3t",
        "Listeners:",
        "  - Name: stunner/gw/udp",
        "    Protocol: TURN-UDP",
        "    Public address:port: <none>:<none>",
        "    Routes: [stunner/a, stunner/b, stunner/missing]",
        "    Endpoints: [10.0.0.1, 10.0.0.2]",  # normalised by the config model
    ]
    assert "Authentication type: none" in config_summary(config({"type": "none"}))
    empty = config({"type": "none"}).model_copy(update={"listeners": []})
    assert config_summary(empty).splitlines()[-1] == (
        "  <none>: every listener was left out (`stunnerctl status` says why)"
    )


@pytest.mark.parametrize(
    ("values", "p50", "p99"),
    [([1.0], 1.0, 1.0), ([1.0, 2.0], 1.0, 2.0), ([float(i) for i in range(1, 101)], 50.0, 99.0)],
)
def test_percentiles_are_nearest_rank(values: list[float], p50: float, p99: float) -> None:
    assert (percentile(values, 0.5), percentile(values, 0.99)) == (p50, p99)


def test_probe_summary_says_ok_or_why_not() -> None:
    base = {"listener": "l", "protocol": "TURN-UDP", "server": "udp://h:1", "error": None}
    ok = {**base, "sent": 4, "received": 4, "loss": 0.0, "ok": True}
    ok |= {"rtt_p50_ms": 0.5, "rtt_p99_ms": 1.25}
    assert probe_summary(ok) == (
        "  - l: TURN-UDP udp://h:1: sent 4, received 4, loss 0.0%, rtt p50 0.50 ms, p99 1.25 ms: OK"
    )
    lossy = {**base, "sent": 4, "received": 0, "loss": 1.0, "ok": False}
    assert probe_summary(lossy).endswith("loss 100.0%, rtt -: FAIL: too much loss")
    assert probe_summary({**base, "error": "boom"}) == "  - l: TURN-UDP udp://h:1: FAIL: boom"


def test_status_is_looked_for_on_the_public_address_or_the_next_loopback_ports() -> None:
    static = {"type": "static", "credentials": {"username": "u", "password": "p"}}
    # No public address, unresolved listener address: the CDS host; loopback: one port a Gateway
    # and a few more (make run skips ports other parts of the stack or other programs hold).
    assert health_urls(config(static), "127.0.0.1", 3) == [
        f"http://127.0.0.1:{port}/status" for port in range(8086, 8086 + 3 + LOOPBACK_SLACK)
    ]
    public = config(static, public="203.0.113.7")
    assert health_urls(public, "cds.example", 3) == ["http://203.0.113.7:8086/status"]
    assert health_urls(public, "cds.example", 3, health_port=9000) == [
        "http://203.0.113.7:9000/status"
    ]
    own = config(static, healthcheck_endpoint="http://[::1]:8100")
    assert health_urls(own, "cds", 2)[:2] == [
        "http://[::1]:8100/status",
        "http://[::1]:8101/status",
    ]
    assert health_urls(config(static, healthcheck_endpoint=""), "127.0.0.1", 2) == []


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_the_gateway_argument_and_namespace_select_what_to_ask_the_cds() -> None:
    assert selector(_args("config")) == (None, None)
    assert selector(_args("-n", "stunner", "config")) == ("stunner", None)
    assert selector(_args("config", "gw")) == ("default", "gw")
    assert selector(_args("config", "-n", "stunner", "gw")) == ("stunner", "gw")
    assert selector(_args("status", "ns/gw")) == ("ns", "gw")
    for bad in ("a/b/c", "/gw", "ns/"):
        with pytest.raises(BadInputError, match="expected NAME or NAMESPACE/NAME"):
            selector(_args("icetest", bad))
