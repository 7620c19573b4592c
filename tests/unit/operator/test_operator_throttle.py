"""The render throttle: 50 ms by default (upstream: 250 ms), set from the environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stunner_operator.settings import OperatorSettings


def test_renders_gather_events_for_50_ms_by_default_and_the_environment_sets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPERATOR_THROTTLE_S", raising=False)
    assert OperatorSettings().throttle_s == 0.05
    monkeypatch.setenv("OPERATOR_THROTTLE_S", "0.25")
    assert OperatorSettings().throttle_s == 0.25
    monkeypatch.setenv("OPERATOR_THROTTLE_S", "-1")
    with pytest.raises(ValidationError, match="throttle_s"):
        OperatorSettings()
