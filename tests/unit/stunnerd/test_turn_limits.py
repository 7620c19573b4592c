"""What one credential, or none, may make the engine hold: each limit at 10x, with explicit `now`.

The failed-authentication budget (per source, per username), the permissions and channels of one
allocation, and the deadline heap under a refresh loop. The scripted clients are those of
`test_turn_engine`.
"""

from __future__ import annotations

import pytest
from aioice import stun
from unit.stunnerd.test_turn_engine import (
    PEER,
    T0,
    Client,
    allocated,
    bind,
    make_engine,
)

from stunnerd.net.guard import ClientLimits
from stunnerd.settings import load_settings
from stunnerd.turn.auth import THROTTLED_REASON
from stunnerd.turn.guard import FailedAuthBudget, RequestLimits, failure_source

pytestmark = pytest.mark.usefixtures("aioice_turn_attributes")


def limits(**kw: float) -> RequestLimits:
    return RequestLimits(**kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the budget itself


@pytest.mark.parametrize(
    ("ip", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_failures_count_per_ipv4_address_and_per_ipv6_slash_64(ip: str, key: str) -> None:
    assert failure_source(ip) == key


def test_a_source_gets_its_burst_of_verdicts_then_the_rate() -> None:
    budget = FailedAuthBudget(limits(auth_failure_rate_per_s=1.0, auth_failure_burst=3))
    for _ in range(3):
        assert budget.refuses("192.0.2.1", "u", 0.0) == ""
        budget.failed("192.0.2.1", "u", 0.0)
    assert budget.refuses("192.0.2.1", "u", 0.0) == "source"
    assert budget.refuses("192.0.2.2", "u", 0.0) == ""  # another source is checked
    assert budget.refuses("192.0.2.1", "u", 1.0) == ""  # one token back after a second
    assert budget.suppressed == {"source": 1, "user": 0}


def test_a_spent_username_refuses_sources_that_failed_but_checks_clean_ones() -> None:
    budget = FailedAuthBudget(
        limits(
            auth_failure_rate_per_s=0.01,
            auth_failure_burst=100,
            user_auth_failure_rate_per_s=0.01,
            user_auth_failure_burst=5,
        )
    )
    for i in range(5):
        budget.failed(f"198.51.100.{i}", "shared", 0.0)
    assert budget.refuses("198.51.100.9", "shared", 0.0) == ""  # never failed: checked
    budget.failed("198.51.100.9", "shared", 0.0)
    assert budget.refuses("198.51.100.9", "shared", 0.0) == "user"
    assert budget.refuses("198.51.100.9", "other-user", 0.0) == ""


def test_unknown_users_cost_only_their_source() -> None:
    budget = FailedAuthBudget(limits(user_auth_failure_burst=1))
    for i in range(10):
        budget.failed(f"203.0.113.{i}", None, 0.0)
    assert len(budget.users) == 0


def test_zero_rates_turn_the_budget_off() -> None:
    budget = FailedAuthBudget(
        limits(auth_failure_rate_per_s=0, user_auth_failure_rate_per_s=0, auth_failure_burst=1)
    )
    for _ in range(100):
        budget.failed("192.0.2.1", "u", 0.0)
    assert budget.refuses("192.0.2.1", "u", 0.0) == ""


def test_the_budget_tables_are_bounded() -> None:
    budget = FailedAuthBudget(RequestLimits(), max_keys=50)
    for i in range(500):
        budget.failed(f"10.0.{i // 256}.{i % 256}", f"user{i}", 0.0)
    assert len(budget.sources) == 50
    assert len(budget.users) == 50


# --------------------------------------------------------------------------- the 401 oracle


def guesser(engine_limits: RequestLimits, addr: tuple[str, int] = ("203.0.113.66", 5000)) -> Client:
    engine = make_engine(limits=engine_limits)
    attacker = Client(engine, addr=addr, password="guess")
    assert attacker.allocate().error_code == 401  # challenged, then a wrong password
    return attacker


def test_a_password_guesser_at_ten_times_the_burst_gets_verdicts_only_within_it() -> None:
    burst = 10
    attacker = guesser(limits(auth_failure_burst=burst, auth_failure_rate_per_s=0.1))
    engine = attacker.engine
    reasons = []
    for i in range(10 * burst):
        reply = attacker.exchange(
            attacker.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}), T0 + i * 0.01
        )
        assert reply is not None
        assert reply.error_code == 401
        reasons.append(reply.attributes["ERROR-CODE"][1])
    assert reasons.count(THROTTLED_REASON) == 10 * burst - (burst - 1)
    assert engine.requests.gate.failures.suppressed["source"] == 10 * burst - (burst - 1)
    # even the right password is not checked for this source now
    attacker.password = "pass1"
    reply = attacker.exchange(
        attacker.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}), T0 + 2
    )
    assert reply is not None
    assert reply.attributes["ERROR-CODE"] == (401, THROTTLED_REASON)
    # an honest client elsewhere is unaffected
    honest = Client(engine, addr=("192.0.2.50", 6000))
    assert honest.allocate(T0 + 2).message_class == stun.Class.RESPONSE
    # and the guesser gets a verdict again once its budget refills (0.1/s: 10 s a token)
    reply = attacker.exchange(
        attacker.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}), T0 + 20
    )
    assert reply is not None
    assert reply.message_class == stun.Class.RESPONSE


def test_throttled_refusals_are_logged_once_per_source_and_counted_as_401(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attacker = guesser(limits(auth_failure_burst=2))
    for i in range(20):
        attacker.exchange(
            attacker.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}), T0 + i * 0.01
        )
    logged = [r for r in caplog.records if r.name == "stunnerd.refusals"]
    assert len(logged) <= 1
    assert attacker.engine.refusals.counts[401] == 21


def test_guessers_spread_over_many_sources_get_one_verdict_each_once_the_user_is_spent() -> None:
    engine = make_engine(
        limits=limits(
            user_auth_failure_burst=10, user_auth_failure_rate_per_s=0.01, auth_failure_burst=30
        )
    )
    verdicts = 0
    for i in range(100):  # 10x the user's burst of failures, from 100 addresses, 3 guesses each
        attacker = Client(engine, addr=(f"198.51.100.{i}", 7000), password="guess")
        replies = [attacker.allocate(T0)]
        for _ in range(2):
            reply = attacker.exchange(
                attacker.build(stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24}), T0
            )
            assert reply is not None
            replies.append(reply)
        assert [r.error_code for r in replies] == [401] * 3
        verdicts += sum(r.attributes["ERROR-CODE"][1] != THROTTLED_REASON for r in replies)
    # the user's burst of 10 (addresses 0-3), then one verdict per new address: 10 + 96, not 300
    assert verdicts == 10 + 96
    honest = Client(engine, addr=("192.0.2.99", 6000))  # the same shared user, never failed
    assert honest.allocate(T0).message_class == stun.Class.RESPONSE


# --------------------------------------------------------------------------- one allocation


def create_permission(client: Client, ip: str, now: float = T0) -> stun.Message:
    return client.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": (ip, 9)}, now)


def test_permissions_past_the_cap_get_508_and_install_nothing() -> None:
    cap = 8
    engine, client = allocated(limits=limits(max_permissions_per_allocation=cap))
    codes = [
        create_permission(client, f"10.1.{i // 256}.{i % 256}").error_code for i in range(10 * cap)
    ]
    assert codes == [None] * cap + [508] * (9 * cap)
    alloc = engine.allocations[client.addr]
    assert len(alloc.permissions) == cap
    refused = create_permission(client, "10.9.9.9")
    assert refused.attributes["ERROR-CODE"] == (
        508,
        "Insufficient Capacity (permissions per allocation)",
    )
    assert create_permission(client, "10.1.0.0").error_code is None  # a refresh is never refused
    assert engine.refusals.counts[508] == 9 * cap + 1


def test_channels_past_the_cap_get_508() -> None:
    cap = 4
    engine, client = allocated(limits=limits(max_channels_per_allocation=cap))
    codes = [bind(client, ("10.0.0.5", 7000 + i), 0x4000 + i).error_code for i in range(10 * cap)]
    assert codes == [None] * cap + [508] * (9 * cap)
    assert len(engine.allocations[client.addr].channels) == cap
    assert bind(client, ("10.0.0.5", 7000), 0x4000).error_code is None  # a refresh


def test_a_channel_to_a_new_peer_ip_past_the_permission_cap_gets_508() -> None:
    _, client = allocated(limits=limits(max_permissions_per_allocation=1))
    assert bind(client, PEER, 0x4000).error_code is None
    assert bind(client, ("10.0.0.6", 7000), 0x4001).error_code == 508
    assert bind(client, (PEER[0], 7001), 0x4002).error_code is None  # the same IP


def test_a_refresh_loop_keeps_one_heap_entry_per_permission_and_channel() -> None:
    engine, client = allocated()
    bind(client, PEER, 0x4000)
    before = len(engine.table.deadlines)
    for i in range(1000):
        now = T0 + i * 0.1
        assert create_permission(client, PEER[0], now).error_code is None
        assert bind(client, PEER, 0x4000, now).error_code is None
        client.request(stun.Method.REFRESH, {"LIFETIME": 600}, now)
    assert len(engine.table.deadlines) == before
    # and the refreshed lifetimes still hold, then end
    engine.tick(T0 + 100 + 299)
    assert PEER[0] in engine.allocations[client.addr].permissions
    engine.tick(T0 + 100 + 601)
    assert client.addr not in engine.allocations


def test_a_shortened_allocation_lifetime_still_expires_on_time() -> None:
    engine, client = allocated()
    client.request(stun.Method.REFRESH, {"LIFETIME": 3600}, T0)
    engine.tick(T0 + 700)  # the first entry (600 s) comes due and moves to the new expiry
    client.request(stun.Method.REFRESH, {"LIFETIME": 600}, T0 + 800)
    client.request(stun.Method.REFRESH, {"LIFETIME": 3600}, T0 + 801)
    client.request(stun.Method.REFRESH, {"LIFETIME": 600}, T0 + 802)
    engine.tick(T0 + 1401)
    assert client.addr in engine.allocations  # expires at T0 + 1402
    engine.tick(T0 + 1402)
    assert client.addr not in engine.allocations
    assert len(engine.table.deadlines) <= 2


# --------------------------------------------------------------------------- settings


def test_the_new_limits_are_stunnerd_settings_and_reach_the_workers() -> None:
    env = {
        "STUNNERD_AUTH_FAILURE_RATE_PER_S": "0.25",
        "STUNNERD_AUTH_FAILURE_BURST": "7",
        "STUNNERD_USER_AUTH_FAILURE_RATE_PER_S": "3",
        "STUNNERD_USER_AUTH_FAILURE_BURST": "50",
        "STUNNERD_MAX_PERMISSIONS_PER_ALLOCATION": "16",
        "STUNNERD_MAX_CHANNELS_PER_ALLOCATION": "8",
    }
    got = load_settings(env, config=None, watch=False, turn_uri=None, ident="a/b").limits
    assert got.request == limits(
        auth_failure_rate_per_s=0.25,
        auth_failure_burst=7,
        user_auth_failure_rate_per_s=3,
        user_auth_failure_burst=50,
        max_permissions_per_allocation=16,
        max_channels_per_allocation=8,
    )
    assert ClientLimits.from_json(got.to_json()) == got
    default = load_settings({}, config=None, watch=False, turn_uri=None, ident="a/b").limits
    assert default.request == RequestLimits()
