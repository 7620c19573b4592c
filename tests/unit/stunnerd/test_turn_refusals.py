"""stunnerd says why it refused a client.

A wrong password (401) or a peer no route admits (403) is logged at INFO with who, from where,
which request and code, and for 403 the peer and the routes considered; a source is logged once
per interval and then counted; every refusal is counted by code for the metrics. The usual first
request without credentials is not a refusal worth a line.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytest
from aioice import stun

from stunner_common.config import parse_config
from stunnerd.admin.metrics import metrics_registry
from stunnerd.routing import policies_for
from stunnerd.status import ListenerStats, StatsSnapshot, merge_snapshots
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import TurnEngine
from stunnerd.turn.refusals import RefusalLog

pytestmark = pytest.mark.usefixtures("aioice_turn_attributes")

T0 = 1_000_000.0
CONFIG = {
    "version": "v1",
    "admin": {"name": "stunner/gw"},
    "auth": {
        "type": "static",
        "realm": "stunner.l7mp.io",
        "credentials": {"username": "user-1", "password": "pass-1"},
    },
    "listeners": [
        {
            "name": "stunner/gw/udp",
            "protocol": "TURN-UDP",
            "address": "127.0.0.1",
            "port": 3478,
            "routes": ["stunner/echo"],
        }
    ],
    "clusters": [{"name": "stunner/echo", "type": "STATIC", "endpoints": ["10.0.0.1/32"]}],
}


class Client:
    def __init__(self, engine: TurnEngine, password: str = "pass-1") -> None:
        self.engine = engine
        self.addr = ("203.0.113.7", 40000)
        self.password = password
        self.nonce: bytes | None = None
        self.realm = ""

    def request(self, method: stun.Method, attrs: dict[str, Any], now: float = T0) -> int | None:
        for _ in range(2):
            msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))
            if self.nonce is not None:
                msg.attributes.update(
                    {"USERNAME": "user-1", "REALM": self.realm, "NONCE": self.nonce}
                )
                key = hashlib.md5(f"user-1:{self.realm}:{self.password}".encode()).digest()
                msg.add_message_integrity(key)
            effects = self.engine.handle_client(bytes(msg), self.addr, now)
            if any(isinstance(e, fx.OpenRelay) for e in effects):
                effects = self.engine.relay_opened(self.addr, 50000, now)
            (reply,) = [
                stun.parse_message(e.data) for e in effects if isinstance(e, fx.SendToClient)
            ]
            if reply.message_class != stun.Class.ERROR:
                return None
            if reply.error_code == 401 and self.nonce is None:
                self.nonce, self.realm = reply.attributes["NONCE"], reply.attributes["REALM"]
                continue
            return reply.error_code
        return 401


def _engine() -> TurnEngine:
    config = parse_config(CONFIG)
    engine = TurnEngine(
        relay_ip="127.0.0.1",
        nonce_secret=b"k" * 32,
        policies=policies_for(config.listeners[0], config),
    )
    engine.refusals.listener = "stunner/gw/udp"
    return engine


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "stunnerd.refusals"]


def test_a_wrong_password_is_logged_once_with_who_and_from_where(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="stunnerd.refusals")
    engine = _engine()
    client = Client(engine, password="wrong")
    allocate = {"REQUESTED-TRANSPORT": 17 << 24}
    assert client.request(stun.Method.ALLOCATE, allocate) == 401
    assert _lines(caplog) == [
        "listener stunner/gw/udp: refused ALLOCATE from 203.0.113.7:40000 (user 'user-1'): "
        "401 Unauthorized: wrong password (MESSAGE-INTEGRITY does not verify)"
    ]
    # The same source again within the interval: counted, not logged.
    for _ in range(3):
        assert client.request(stun.Method.ALLOCATE, allocate, now=T0 + 1) == 401
    assert len(_lines(caplog)) == 1
    assert engine.refusals.counts[401] == 4
    # After the interval: the count of what was held back, then the new refusal in full.
    client.request(stun.Method.ALLOCATE, allocate, now=T0 + 61)
    lines = _lines(caplog)
    assert lines[1] == (
        "listener stunner/gw/udp: refused 3 more request(s) from 203.0.113.7 in 60 s (3x 401)"
    )
    assert lines[2].startswith("listener stunner/gw/udp: refused ALLOCATE from 203.0.113.7")


def test_the_usual_first_request_without_credentials_is_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="stunnerd.refusals")
    engine = _engine()
    assert Client(engine).request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}) is None
    assert _lines(caplog) == []
    assert not engine.refusals.counts


def test_a_forbidden_peer_names_the_peer_and_the_routes_considered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="stunnerd.refusals")
    engine = _engine()
    client = Client(engine)
    assert client.request(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}) is None
    peer = ("198.51.100.9", 9001)
    # Logged although a 401 from the same source came just before: the limit is per code too.
    engine.refusals.refused(T0, client.addr, "ALLOCATE", 401, "Unauthorized")
    caplog.clear()
    assert client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": peer}) == 403
    assert _lines(caplog) == [
        "listener stunner/gw/udp: refused CREATE_PERMISSION from 203.0.113.7:40000 "
        "(user 'user-1'): 403 Forbidden (peer not admitted by any route): peer 198.51.100.9:9001 "
        "is admitted by no route (routes considered: stunner/echo (UDP: 10.0.0.1))"
    ]
    assert engine.refusals.counts == {401: 1, 403: 1}


def test_refusals_reach_the_metrics_by_code_summed_over_workers() -> None:
    a = StatsSnapshot((ListenerStats("l", refusals=((401, 2), (403, 1))),))
    b = StatsSnapshot.from_dict(
        StatsSnapshot((ListenerStats("l", refusals=((401, 5),)),)).to_dict()
    )
    merged = merge_snapshots([a, b])
    assert merged.listener("l").refusals == ((401, 7), (403, 1))
    registry = metrics_registry(lambda: merged)
    assert (
        registry.get_sample_value("stunner_listener_refusals_total", {"name": "l", "code": "401"})
        == 7
    )
    assert (
        registry.get_sample_value("stunner_listener_refusals_total", {"name": "l", "code": "403"})
        == 1
    )


def test_many_sources_stay_bounded() -> None:
    log = RefusalLog("l", max_sources=4)
    for i in range(100):
        log.refused(T0, (f"10.0.0.{i}", 1), "ALLOCATE", 401, "Unauthorized")
    assert len(log._sources) <= 4
    assert log.counts[401] == 100
