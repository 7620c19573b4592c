"""The hardening knobs: STUNNERD_* variables reach the limits every listener and worker uses."""

from __future__ import annotations

import pytest

from stunnerd.net.guard import ClientLimits, ConnectionLimits, SourceCounter
from stunnerd.settings import SettingsError, load_settings
from stunnerd.turn.guard import RequestLimits


def settings_from(env: dict[str, str]) -> ClientLimits:
    return load_settings(env, config=None, watch=False, turn_uri=None, ident="a/b").limits


def test_defaults_are_the_documented_ones() -> None:
    limits = settings_from({})
    assert limits.request == RequestLimits(1500, 40, 100.0, 200)
    assert limits.connection == ConnectionLimits(64, 10.0, 10.0, 8.0, 10.0)


def test_every_knob_is_read_from_the_environment() -> None:
    limits = settings_from(
        {
            "STUNNERD_MAX_STUN_MESSAGE_BYTES": "1200",
            "STUNNERD_MAX_STUN_ATTRIBUTES": "20",
            "STUNNERD_CHALLENGE_RATE_PER_S": "0",
            "STUNNERD_CHALLENGE_BURST": "5",
            "STUNNERD_MAX_CONNECTIONS_PER_SOURCE": "3",
            "STUNNERD_HANDSHAKE_TIMEOUT_S": "2",
            "STUNNERD_FIRST_MESSAGE_TIMEOUT_S": "4",
            "STUNNERD_PREAUTH_MIN_BYTES_PER_S": "16",
            "STUNNERD_PREAUTH_WINDOW_S": "5",
        }
    )
    assert limits == ClientLimits(RequestLimits(1200, 20, 0.0, 5), ConnectionLimits(3, 2, 4, 16, 5))
    assert ClientLimits.from_json(limits.to_json()) == limits  # what workers get


@pytest.mark.parametrize(
    "env",
    [
        {"STUNNERD_MAX_STUN_MESSAGE_BYTES": "100"},  # below the 548 every STUN agent must take
        {"STUNNERD_FIRST_MESSAGE_TIMEOUT_S": "0"},
        {"STUNNERD_CHALLENGE_RATE_PER_S": "-1"},
    ],
)
def test_nonsense_values_are_refused(env: dict[str, str]) -> None:
    setting = next(iter(env)).removeprefix("STUNNERD_").lower()
    with pytest.raises(SettingsError, match=f"^{setting}: Input should be "):
        settings_from(env)


def test_source_counter_caps_and_forgets() -> None:
    counter = SourceCounter(2)
    assert [counter.acquire("a") for _ in range(3)] == [True, True, False]
    counter.release("a")
    assert counter.acquire("a")
    counter.release("a")
    counter.release("a")
    assert counter.counts == {}
    assert all(SourceCounter(0).acquire("b") for _ in range(100))  # 0: unlimited


def test_the_udp_datagram_read_limit_is_a_knob_with_bounds() -> None:
    assert settings_from({}).request.max_udp_datagram_bytes == 9216
    limits = settings_from({"STUNNERD_MAX_UDP_DATAGRAM_BYTES": "4096"})
    assert limits.request.max_udp_datagram_bytes == 4096
    assert ClientLimits.from_json(limits.to_json()) == limits  # what workers get
    for bad in ("1000", "70000"):  # under an MTU; over what the C relay can read
        with pytest.raises(SettingsError, match=r"^max_udp_datagram_bytes: "):
            settings_from({"STUNNERD_MAX_UDP_DATAGRAM_BYTES": bad})
