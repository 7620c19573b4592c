"""Every refusal the engine decides is counted by the limit behind it, and only by that one.

The scripted clients of `test_turn_engine` drive one engine past each limit it enforces; the
counts then travel as the worker wire carries them (`StatsSnapshot.to_dict`/`from_dict`), are
summed over workers (`merge_snapshots`) and come out of the metrics collector as
`stunner_listener_limit_refusals_total{name, limit}`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from aioice import stun
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from unit.stunnerd.test_turn_engine import (
    PEER,
    T0,
    Client,
    allocated,
    bind,
    make_engine,
    static_policies,
)

from stunnerd.admin.metrics import metrics_registry
from stunnerd.status import ListenerStats, StatsSnapshot, merge_snapshots
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import TurnEngine
from stunnerd.turn.guard import RequestLimits
from stunnerd.turn.refusals import LIMITS
from stunnerd.workers.local import _NoNewAllocations

pytestmark = pytest.mark.usefixtures("aioice_turn_attributes")

ALLOCATE = {"REQUESTED-TRANSPORT": 17 << 24}


def limits(**kw: float) -> RequestLimits:
    return RequestLimits(**kw)  # type: ignore[arg-type]


def moved(engine: TurnEngine) -> dict[str, int]:
    """The limits whose count is not zero."""
    return {name: n for name, n in engine.refusals.limit_counts() if n}


def guess(client: Client, now: float = T0) -> stun.Message:
    reply = client.exchange(client.build(stun.Method.ALLOCATE, ALLOCATE), now)
    assert reply is not None
    return reply


def test_every_limit_is_listed_zero_before_any_refusal() -> None:
    engine = make_engine()
    assert [name for name, _ in engine.refusals.limit_counts()] == list(LIMITS)
    assert moved(engine) == {}


def test_a_wrong_password_is_no_limit_but_a_throttled_one_counts_against_its_source() -> None:
    engine = make_engine(limits=limits(auth_failure_burst=3, auth_failure_rate_per_s=0.01))
    attacker = Client(engine, addr=("203.0.113.66", 5000), password="guess")
    assert attacker.allocate().error_code == 401  # the challenge, then the first verdict
    for _ in range(2):
        assert guess(attacker).error_code == 401
    assert moved(engine) == {}  # three verdicts: wrong passwords, within the budget
    for _ in range(7):
        assert guess(attacker).error_code == 401
    assert moved(engine) == {"auth_failures_source": 7}


def test_a_spent_username_counts_against_the_user() -> None:
    engine = make_engine(
        limits=limits(
            user_auth_failure_burst=2, user_auth_failure_rate_per_s=0.01, auth_failure_burst=30
        )
    )
    for i in range(2):
        assert Client(engine, addr=(f"198.51.100.{i}", 7000), password="g").allocate() is not None
    attacker = Client(engine, addr=("198.51.100.9", 7000), password="guess")
    attacker.allocate()  # a verdict: this source has no failure on record
    for _ in range(5):
        assert guess(attacker).error_code == 401
    assert moved(engine) == {"auth_failures_user": 5}


def test_challenges_over_the_source_rate_are_dropped_and_counted() -> None:
    engine = make_engine(limits=limits(challenge_burst=3, challenge_rate_per_s=0.01))
    client = Client(engine)
    raw = client.build(stun.Method.ALLOCATE, ALLOCATE)
    answered = [client.exchange(raw, T0 + i * 0.001) for i in range(10)]
    assert sum(reply is not None for reply in answered) == 3
    assert moved(engine) == {"challenge_rate": 7}


def test_a_message_over_the_size_limit_and_too_many_attributes() -> None:
    engine = make_engine(limits=limits(max_message_bytes=548, max_attributes=8))
    client = Client(engine)
    big = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
    big.attributes["SOFTWARE"] = "x" * 600
    assert client.exchange(bytes(big), T0) is None
    assert moved(engine) == {"message_bytes": 1}
    many = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
    many.attributes["SOFTWARE"] = "x"
    raw = bytes(many)
    attribute = raw[20:]  # SOFTWARE, padded: repeat it past the cap
    raw = raw[:2] + (len(attribute) * 9).to_bytes(2, "big") + raw[4:20] + attribute * 9
    reply = client.exchange(raw, T0)
    assert reply is not None
    assert reply.error_code == 400
    assert moved(engine) == {"message_bytes": 1, "attributes": 1}


def test_permissions_and_channels_past_their_caps() -> None:
    engine, client = allocated(
        limits=limits(max_permissions_per_allocation=2, max_channels_per_allocation=2)
    )
    codes = [
        client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": (f"10.1.0.{i}", 9)})
        for i in range(1, 6)
    ]
    assert [c.error_code for c in codes] == [None, None, 508, 508, 508]
    assert moved(engine) == {"permissions_per_allocation": 3}
    assert [bind(client, ("10.1.0.1", 7000 + i), 0x4000 + i).error_code for i in range(4)] == [
        None,
        None,
        508,
        508,
    ]
    assert moved(engine) == {"permissions_per_allocation": 3, "channels_per_allocation": 2}
    assert bind(client, (PEER[0], 7100), 0x4010).error_code == 508
    # a channel past the channel cap is refused by that cap, whatever its peer
    assert moved(engine)["channels_per_allocation"] == 3


def test_the_user_quota_and_the_cluster_quota_count_as_user_quota() -> None:
    engine = make_engine(static_policies(quota=1))
    assert Client(engine, addr=("192.0.2.1", 1000)).allocate().message_class == stun.Class.RESPONSE
    assert Client(engine, addr=("192.0.2.2", 1000)).allocate().error_code == 486
    assert moved(engine) == {"user_quota": 1}
    other = make_engine()
    second = Client(other, addr=("192.0.2.3", 1000))
    challenge = guess(second)
    second.nonce, second.realm = challenge.attributes["NONCE"], challenge.attributes["REALM"]
    effects = other.handle_client(second.build(stun.Method.ALLOCATE, ALLOCATE), second.addr, T0)
    assert any(isinstance(e, fx.OpenRelay) for e in effects)
    # the edge's cluster-wide quota refuses the relay
    other.relay_failed(second.addr, T0, 486, "Allocation Quota Reached", "user_quota")
    other.relay_failed(("192.0.2.4", 1), T0)  # a relay socket that would not open: no limit
    assert moved(other) == {"user_quota": 1}


def test_a_drain_refuses_allocations_with_486_but_counts_no_limit() -> None:
    base = static_policies()
    engine = make_engine(dataclasses.replace(base, quota=_NoNewAllocations()))
    assert Client(engine).allocate().error_code == 486
    assert engine.refusals.counts[486] == 1
    assert moved(engine) == {}


def listener(name: str, **counts: int) -> ListenerStats:
    return ListenerStats(name, limit_refusals=tuple((n, counts.get(n, 0)) for n in LIMITS))


def test_limit_counts_cross_the_worker_wire_and_add_up_over_workers() -> None:
    one = StatsSnapshot((listener("udp", user_quota=2, challenge_rate=1),))
    two = StatsSnapshot((listener("udp", user_quota=3), listener("tcp", attributes=4)))
    wired = [StatsSnapshot.from_dict(s.to_dict()) for s in (one, two)]
    assert wired == [one, two]
    total = merge_snapshots(wired)
    assert dict(total.listener("udp").limit_refusals) == dict(
        listener("udp", user_quota=5, challenge_rate=1).limit_refusals
    )
    assert dict(total.listener("tcp").limit_refusals)["attributes"] == 4
    # a worker of an older release sends no limit counts: it adds nothing
    old = one.to_dict()
    old["listeners"][0] = old["listeners"][0][:6]
    assert StatsSnapshot.from_dict(old).listener("udp").limit_refusals == ()


def test_the_collector_exposes_one_series_per_listener_and_limit() -> None:
    snap = StatsSnapshot((listener("default/gw/udp", auth_failures_source=7),))
    scrape = generate_latest(metrics_registry(lambda: snap)).decode()
    found: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            if sample.name == "stunner_listener_limit_refusals_total":
                found[(sample.labels["name"], sample.labels["limit"])] += int(sample.value)
    assert set(found) == {("default/gw/udp", name) for name in LIMITS}
    assert +found == Counter({("default/gw/udp", "auth_failures_source"): 7})
