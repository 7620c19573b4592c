"""The one capped, jittered exponential backoff every reconnect loop uses."""

from __future__ import annotations

import pytest

from stunner_common.backoff import Backoff


def test_backoff_grows_exponentially_up_to_the_cap_and_is_jittered() -> None:
    b = Backoff(initial_s=0.5, cap_s=4.0)
    lows = [b.delay_s(n, lambda: 0.0) for n in range(6)]
    highs = [b.delay_s(n, lambda: 0.999999) for n in range(6)]
    assert lows == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert highs[0] == pytest.approx(0.5)
    assert highs[5] == pytest.approx(4.0)
    assert all(lo < hi for lo, hi in zip(lows, highs, strict=True))
    assert b.delay_s(10_000, lambda: 0.5) == pytest.approx(3.0)


def test_the_delay_never_exceeds_the_cap_nor_falls_below_half_the_ceiling() -> None:
    b = Backoff(initial_s=0.02, cap_s=0.1)
    for attempt in range(12):
        ceiling = b.ceiling_s(attempt)
        assert ceiling <= 0.1
        assert ceiling / 2 <= b.delay_s(attempt) <= ceiling


@pytest.mark.parametrize(
    ("initial_s", "cap_s", "factor"), [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (0.1, 1.0, 0.5)]
)
def test_a_backoff_that_cannot_grow_sanely_is_refused(
    initial_s: float, cap_s: float, factor: float
) -> None:
    with pytest.raises(ValueError, match="invalid backoff"):
        Backoff(initial_s=initial_s, cap_s=cap_s, factor=factor)
